"""Freed memory kept for reuse: a second 64 MiB buffer costs no page faults (heap.py), on
the main thread and on another one (the bulk channel serves each connection on its own)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# (Transparent huge pages are turned off for the child, so that a fault is one 4 KiB page.)
TOUCH_TWICE = """
import ctypes, json, resource, sys, threading
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
import numpy as np
from elasticdl_nb.runtime.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults_of_a_buffer():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = np.empty(64 << 20, np.uint8)
    buffer[:] = 1  # (a received tensor's bytes)
    del buffer
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
def twice(out):
    faults_of_a_buffer()
    out.append(faults_of_a_buffer())
faults = []
if sys.argv[2] == "thread":
    thread = threading.Thread(target=twice, args=(faults,))
    thread.start()
    thread.join()
else:
    twice(faults)
print(json.dumps({"kept": kept, "second": faults[0]}))
"""


def _second_buffer(mode: str, where: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", TOUCH_TWICE, mode, where],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_second_large_buffer_reuses_the_pages_of_the_first(where):
    kept = _second_buffer("keep", where)
    if not kept["kept"]:
        pytest.skip("not glibc's malloc: nothing to tune")
    pages = (64 << 20) // 4096
    assert kept["second"] < pages // 20
    # Without it, the same buffer faults in every page again (what the setting saves).
    assert _second_buffer("default", where)["second"] > pages // 2
