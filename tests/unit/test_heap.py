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
if sys.argv[1] == "keep-late":  # a thread allocated first: its arena outlives it
    early = threading.Thread(target=lambda: [bytearray(1000) for _ in range(100)])
    early.start()
    early.join()
from elasticdl_nb.runtime.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1].startswith("keep") else None
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
threads_before = None
if sys.argv[2] == "after-imports":  # as a process's __main__ does: the settings first
    import os
    import elasticdl_nb.runtime.ps.process, elasticdl_nb.runtime.worker.process
    threads_before = len(os.listdir("/proc/self/task"))  # the imports started some
if sys.argv[2] in ("thread", "after-imports"):
    thread = threading.Thread(target=twice, args=(faults,))
    thread.start()
    thread.join()
else:
    twice(faults)
print(json.dumps({"kept": kept, "second": faults[0], "threads_before": threads_before}))
"""


def _second_buffer(mode: str, where: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", TOUCH_TWICE, mode, where],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("where", ["main", "thread", "after-imports"])
def test_a_second_large_buffer_reuses_the_pages_of_the_first(where):
    kept = _second_buffer("keep", where)
    if not kept["kept"]:
        pytest.skip("not glibc's malloc: nothing to tune")
    pages = (64 << 20) // 4096
    assert kept["second"] < pages // 20
    if where == "after-imports":  # a new thread, among the threads TensorFlow started
        assert kept["threads_before"] > 1
        return
    if where == "thread":  # why each process calls it first: a later call comes too late
        assert _second_buffer("keep-late", where)["second"] > pages // 2
    # Without it, the same buffer faults in every page again (what the setting saves).
    assert _second_buffer("default", where)["second"] > pages // 2
