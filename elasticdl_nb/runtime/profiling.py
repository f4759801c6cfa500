"""Optional cProfile of a job process, for finding where a worker or PS spends its time.

With `ELASTICDL_NB_PROFILE_DIR` set in the environment of the caller, every worker and PS
writes `<role>-<pid>.prof` there when it exits normally (read it with `pstats`). The
profile covers every Python thread of the process, not just the main one: a PS does its
work in gRPC handler threads, a worker sends in background threads. Each thread gets its
own profiler when it first runs Python code; their statistics are merged at exit.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import threading
from collections.abc import Callable
from pathlib import Path

PROFILE_ENV = "ELASTICDL_NB_PROFILE_DIR"


def run(main: Callable[[], None], role: str) -> None:
    directory = os.environ.get(PROFILE_ENV)
    if not directory:
        main()
        return
    profilers: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_in_new_thread(frame, event, arg) -> None:
        # Called once per new thread (threading.setprofile): replace this hook by a
        # profiler of the thread's own.
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()

    main_profiler = cProfile.Profile()
    threading.setprofile(start_in_new_thread)
    try:
        main_profiler.runcall(main)
    finally:
        threading.setprofile(None)
        stats = pstats.Stats(main_profiler)
        with lock:
            others = list(profilers)
        for profiler in others:  # threads still running are read as they are now
            try:
                stats.add(profiler)
            except (TypeError, ValueError):  # a profiler that recorded nothing
                pass
        Path(directory).mkdir(parents=True, exist_ok=True)
        stats.dump_stats(Path(directory) / f"{role}-{os.getpid()}.prof")
