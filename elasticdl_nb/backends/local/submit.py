"""Start a local job, detached from the caller, and stop it again.

The job's supervisor (`supervisor.py`) runs in a session of its own, so a kernel restart
or a closed terminal does not end the job; the master, workers and PS it starts share
that session, so stopping the session stops the job, however it got stuck. The
supervisor restarts a master that dies; the job ends with the supervisor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from elasticdl_nb.backends.job_records import SUPERVISOR_MODULE, JobRecord, process_gone
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.keras_flavor import LEGACY_ENV, environ_for
from elasticdl_nb.runtime.job_dir import SUPERVISOR, log_tail
from elasticdl_nb.runtime.process_env import TLS_DIR_ENV
from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV

MASTER_START_TIMEOUT = 60.0
JOB_TMP = "tmp"  # the job's processes' TMPDIR, in the job directory


class LaunchError(ElasticDLError, RuntimeError):
    """The master did not come up; the message carries the end of its log."""


def start_master(record: JobRecord) -> dict:
    """Spawn the job's supervisor, which starts the master, and wait until the master
    serves; returns master.json: {'address', 'pid', 'supervisor_pid'}."""
    logs = record.files.logs
    logs.mkdir(exist_ok=True)
    env = dict(os.environ)
    env[TOKEN_ENV] = record.token
    env.pop(TLS_DIR_ENV, None)  # (a notebook that is itself a job's process: not its TLS)
    # Temporary files in the job directory (owner-only), not the machine's shared /tmp:
    # TensorFlow's autograph writes each converted function's source there (the model's
    # code) and Python then makes /tmp/__pycache__ for it, which the first user to do
    # so owns. Nothing of a job is left in a place that other users share.
    private_tmp = record.dir / JOB_TMP
    private_tmp.mkdir(mode=0o700, exist_ok=True)
    env["TMPDIR"] = str(private_tmp)
    if record.tls is not None:  # the job has TLS: every process reads its files there
        env[TLS_DIR_ENV] = str(record.files.tls)
    # The supervisor forks the master, workers and PS; gRPC's fork handlers, were any
    # process to fork while its gRPC threads run, would then run in the child before exec
    # and can abort it. Nothing forked uses gRPC.
    env["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    # The Keras the job runs (keras_version, resolved at launch), in every process of it.
    env.pop(LEGACY_ENV, None)
    env.update(environ_for(record.files.read_spec().keras_version))
    # The caller's working directory and path come along, so modules the user's
    # functions import by name (a helper module beside the notebook) import in the job too.
    env["PYTHONPATH"] = os.pathsep.join(
        [os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)]]
    )
    with open(record.files.log(SUPERVISOR), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", SUPERVISOR_MODULE, "--job-dir", str(record.dir)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    # Reap the supervisor when it exits, so a finished job leaves no zombie in the caller.
    threading.Thread(target=proc.wait, daemon=True, name=f"reap-{record.name}").start()
    master_log = record.files.log("master")
    deadline = time.monotonic() + MASTER_START_TIMEOUT
    while time.monotonic() < deadline:
        master = record.master
        if master and master.get("supervisor_pid") == proc.pid:
            return master
        if proc.poll() is not None:  # it ends with the first master's exit code
            raise LaunchError(
                f"The master of job {record.name!r} exited with code "
                f"{proc.returncode} before serving. Its log "
                f"({master_log}):\n{log_tail(master_log)}"
            )
        time.sleep(0.05)
    _end_group(proc.pid, lambda: proc.poll() is None, grace_seconds=10.0)
    raise LaunchError(
        f"The master of job {record.name!r} did not start serving within "
        f"{MASTER_START_TIMEOUT:.0f} s; it was stopped. Its log:\n"
        f"{log_tail(master_log)}"
    )


def kill_job(record: JobRecord, grace_seconds: float = 10.0) -> None:
    """SIGTERM the job's process group (its supervisor's session), then SIGKILL it if it
    lingers."""
    master = record.master
    if not master or not record.master_alive():
        return
    _end_group(master.get("supervisor_pid") or master["pid"], record.master_alive, grace_seconds)


def _end_group(pgid: int, alive: Callable[[], bool], grace_seconds: float) -> None:
    """SIGTERM process group `pgid`; SIGKILL it once its leader has not ended in time."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and alive():
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Back only once the leader is gone: a process on its way out has no command line
    # any more (so `alive` says no) well before it is a zombie, and a caller that looks
    # right after would find it still there (seen in CI under load).
    deadline = time.monotonic() + LEADER_EXIT_SECONDS
    while time.monotonic() < deadline and not process_gone(pgid):
        time.sleep(0.01)


LEADER_EXIT_SECONDS = 5.0
