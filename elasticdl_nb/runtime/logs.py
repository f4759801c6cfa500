"""Log format shared by the job's processes (each logs to stdout; the backend keeps it),
and the stack dump a hung process gives on SIGUSR1.

On Kubernetes a pod's stdout is the pod log; each process also writes its log into the
job directory (`ELASTICDL_NB_LOG_DIR`), where the master reads a crashed worker's last
lines and the notebook reads logs as it does for a local job, with no pod-log access.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path

LOG_DIR_ENV = "ELASTICDL_NB_LOG_DIR"
_FORMAT = "%(asctime)s {role} %(levelname)s %(message)s"


def setup_logging(role: str) -> None:
    """`role` names the process as its log file does: 'master', 'worker-3', 'ps-0'."""
    # TensorFlow's C++ start-up chatter drowns the lines that matter in a job log.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    log_dir = os.environ.get(LOG_DIR_ENV)
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(log_dir) / f"{role}.log"))
        # An uncaught exception goes to stderr only; log it, so the file has it too.
        sys.excepthook = lambda *exc: logging.getLogger("elasticdl_nb").critical(
            "uncaught exception", exc_info=exc
        )
    logging.basicConfig(
        level=os.environ.get("ELASTICDL_NB_LOG_LEVEL", "INFO"),
        format=_FORMAT.format(role=role),
        handlers=handlers,
        force=True,
    )
    # `kill -USR1 <pid>` writes every thread's stack into the log: how a hang is diagnosed
    # (py-spy cannot attach everywhere).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
