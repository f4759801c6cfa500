"""Optional cProfile of a job process, for finding where a worker or PS spends its time.

With `ELASTICDL_NB_PROFILE_DIR` set in the environment of the caller, every worker and PS
writes `<role>-<id>.prof` there when it exits normally (read it with `pstats`).
"""

from __future__ import annotations

import cProfile
import os
from collections.abc import Callable
from pathlib import Path

PROFILE_ENV = "ELASTICDL_NB_PROFILE_DIR"


def run(main: Callable[[], None], role: str) -> None:
    directory = os.environ.get(PROFILE_ENV)
    if not directory:
        main()
        return
    profiler = cProfile.Profile()
    try:
        profiler.runcall(main)
    finally:
        Path(directory).mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(Path(directory) / f"{role}-{os.getpid()}.prof")
