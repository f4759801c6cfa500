"""Start a local job's master, detached from the caller, and stop it again.

The master runs in a session of its own, so a kernel restart or a closed terminal does not
end the job; the workers and PS it starts share that session, so stopping the session
stops the job, however it got stuck.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from elasticdl_nb.backends.job_records import MASTER_MODULE, JobRecord
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.runtime.job_dir import log_tail
from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV

MASTER_START_TIMEOUT = 60.0


class LaunchError(ElasticDLError, RuntimeError):
    """The master did not come up; the message carries the end of its log."""


def start_master(record: JobRecord) -> dict:
    """Spawn the master and wait until it serves; returns {'address', 'pid', 'ps'}."""
    logs = record.files.logs
    logs.mkdir(exist_ok=True)
    env = dict(os.environ)
    env[TOKEN_ENV] = record.token
    # The master forks workers while its gRPC threads run; gRPC's fork handlers would
    # then run in the child before exec and can abort it. Nothing forked uses gRPC.
    env["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    # The caller's working directory and path come along, so modules the user's
    # functions import by name (a helper module beside the notebook) import in the job too.
    env["PYTHONPATH"] = os.pathsep.join(
        [os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)]]
    )
    master_log = record.files.log("master")
    with open(master_log, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", MASTER_MODULE, "--job-dir", str(record.dir)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    # Reap the master when it exits, so a finished job leaves no zombie in the caller.
    threading.Thread(target=proc.wait, daemon=True, name=f"reap-{record.name}").start()
    deadline = time.monotonic() + MASTER_START_TIMEOUT
    while time.monotonic() < deadline:
        master = record.master
        if master and master.get("pid") == proc.pid:
            return master
        if proc.poll() is not None:
            raise LaunchError(
                f"The master of job {record.name!r} exited with code "
                f"{proc.returncode} before serving. Its log "
                f"({master_log}):\n{log_tail(master_log)}"
            )
        time.sleep(0.05)
    kill_job(record)
    raise LaunchError(
        f"The master of job {record.name!r} did not start serving within "
        f"{MASTER_START_TIMEOUT:.0f} s; it was stopped. Its log:\n"
        f"{log_tail(master_log)}"
    )


def kill_job(record: JobRecord, grace_seconds: float = 10.0) -> None:
    """SIGTERM the job's process group, then SIGKILL it if it lingers."""
    master = record.master
    if not master or not record.master_alive():
        return
    pgid = master["pid"]
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and record.master_alive():
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
