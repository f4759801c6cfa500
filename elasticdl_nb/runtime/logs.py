"""Log format shared by the job's processes (each logs to stdout; the backend keeps it),
and the stack dump a hung process gives on SIGUSR1."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys


def setup_logging(role: str) -> None:
    # TensorFlow's C++ start-up chatter drowns the lines that matter in a job log.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(
        level=os.environ.get("ELASTICDL_NB_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {role} %(levelname)s %(message)s",
        stream=sys.stdout,
        force=True,
    )
    # `kill -USR1 <pid>` writes every thread's stack into the log: how a hang is diagnosed
    # (py-spy cannot attach everywhere).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
