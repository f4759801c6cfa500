"""Keep freed memory in the process for reuse: large tensors are not paid for twice.

glibc's malloc serves an allocation above its mmap threshold (at most 32 MiB) with fresh
pages from the kernel and gives them back on free. A worker and a PS allocate buffers of a
tensor's size on every exchange (the received bytes, the variable read out, the update's
temporaries), so each 64 MiB tensor cost 16,384 page faults and the zeroing of 64 MiB
more than once per exchange: measured, 64 MiB pushes and pulls ran at 0.3 of a plain
socket, 16 MiB ones (under the threshold, served again from the heap) at 0.75-0.8
(bench/transfer.py, bench/profiles.md). With `keep_freed_memory()` every allocation comes
from the heap and freed memory stays there (not trimmed back), so the next exchange's
buffers are pages already mapped.

That holds for the main arena only. A thread other than the first allocates from an
arena of its own, whose heaps are at most 64 MiB: a 64 MiB tensor does not fit one and
is mapped afresh every time, whatever the settings (measured: all 16,384 pages faulted
in again on the bulk channel's thread; the 64 MiB push stayed at ~0.4 of the socket while
16 MiB ran at 0.8). So every thread is sent to the main arena (`M_ARENA_MAX` 1). Threads
then share one malloc lock; ours hold the GIL for most of their allocations anyway.

**Call it first**, before anything starts a thread: the `__main__` of each process kind
and the local fork server do. An arena made before the call outlives it, and a thread
started later may be handed it: importing TensorFlow and gRPC starts threads. Called
after a gRPC server's threads had allocated, it left bench/transfer.py's client (which
stands in for a worker) with a bulk receiver that mapped each 64 MiB tensor afresh, in
some runs and not others: its 64 MiB pull measured 0.37 of the socket in one
`make bench` and 1.77 in the one before.

The cost: a process keeps the peak of what it allocated (its RSS does not shrink after a
large transient allocation). Only glibc's malloc is tuned; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("elasticdl_nb.heap")

# mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = (1 << 31) - 1  # (an int: the largest the call takes)


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve large allocations from the heap and keep what is
    freed; returns whether it took the settings (False: not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    taken = (
        mallopt(_M_MMAP_MAX, 0) == 1
        and mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM) == 1
        and mallopt(_M_ARENA_MAX, 1) == 1
    )
    if not taken:
        log.debug("malloc did not take the heap settings: large buffers are mmapped")
    return taken
