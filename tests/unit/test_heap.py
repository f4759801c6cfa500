"""Freed memory kept for reuse: a second 64 MiB buffer costs no page faults (heap.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# (Transparent huge pages are turned off for the child, so that a fault is one 4 KiB page.)
TOUCH_TWICE = """
import ctypes, json, resource, sys
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
faults_of_a_buffer()
print(json.dumps({"kept": kept, "second": faults_of_a_buffer()}))
"""


def _second_buffer(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", TOUCH_TWICE, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_a_second_large_buffer_reuses_the_pages_of_the_first():
    kept = _second_buffer("keep")
    if not kept["kept"]:
        pytest.skip("not glibc's malloc: nothing to tune")
    pages = (64 << 20) // 4096
    assert kept["second"] < pages // 20
    # Without it, the same buffer faults in every page again (what the setting saves).
    assert _second_buffer("default")["second"] > pages // 2
