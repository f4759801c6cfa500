"""What SIGTERM means to a Kubernetes job's master.

The runtime's master stops the job on SIGTERM (`runtime/master/serve.py`): that is how a
local job's supervisor stops it. A kubelet sends SIGTERM whenever the master's pod goes.
When the pod goes because its Job is being deleted, the job is being stopped, and the
runtime's handler does that (every instance ends, the end is recorded). But the pod may
go alone — deleted, evicted, its node drained — while the Job stays and makes a new
master pod to take the job over. Then this master must leave the job as it is (its
workers and PS run on) and exit at once, before the new master opens the journal, as if
it had been killed.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger("elasticdl_nb.master")

# The exit of a master that leaves its job to the next one: non-zero (a kubelet that
# is not removing the pod restarts it in place), and what SIGTERM's default would give.
LEAVING_EXIT = 128 + signal.SIGTERM


def take_over_sigterm(
    job_going: Callable[[], bool], before_leaving: Callable[[], None] = lambda: None
) -> bool:
    """From now on SIGTERM stops the job (the handler set until now: the runtime's) only
    if `job_going()` says the job's Job is being deleted; else `before_leaving()` (the
    master lets its lease go, for the next master to take at once) and the process exits
    with LEAVING_EXIT. Only the main thread may set a handler: returns whether it did."""
    if threading.current_thread() is not threading.main_thread():
        log.warning("SIGTERM still stops the job: not called from the main thread")
        return False
    stop_the_job = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame) -> None:
        if job_going():
            log.info("SIGTERM and the job's Job is being deleted: stopping the job")
            if callable(stop_the_job):
                stop_the_job(signum, frame)
            return
        log.warning(
            "SIGTERM, but the job's Job stays: only this master pod goes; the Job's next "
            "master takes the job over (its workers and PS run on)"
        )
        before_leaving()
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(LEAVING_EXIT)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True
