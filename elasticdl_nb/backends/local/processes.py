"""Worker and PS processes of a local job, started and reaped by the job's supervisor
(`supervisor.py`) on its master's request.

Each instance is forked by the job's fork server (`forkserver.py`: TensorFlow already
imported), the supervisor's child, once it is ready; before that, or if it is gone, the
supervisor starts it as a new interpreter of its own. Either way its parent knows its exit
code or signal exactly and it runs in the supervisor's session, and it asks the kernel to
kill it if its parent dies (see `elasticdl_nb.runtime.lifeline`; the fork server's own
lifeline is the supervisor): a job never leaves processes behind, however it ends, while
a master that dies leaves them running for the next one. The kernel ties that signal to
the *thread* that forked, so the supervisor forks everything from its one thread.

What happened to each instance is kept here as an event (the fields of
`runtime.master.site.InstanceEvent`, as a dict: no gRPC in the supervisor), so a master
that starts later can learn it (`states`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from elasticdl_nb.backends.local.forkserver_link import (
    ForkedProcess,
    ForkServerLink,
    ServerState,
)
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.lifeline import PARENT_ENV
from elasticdl_nb.vocabulary import InstanceState, Role

log = logging.getLogger("elasticdl_nb.supervisor")

Event = dict[str, Any]  # role, instance_id, kind, and exit_code, signal, reason, pid
Process = subprocess.Popen | ForkedProcess


class LocalProcesses:
    """The workers and PS of one job, as children of the calling process. Not thread
    safe: one thread starts, kills and reaps them."""

    def __init__(self, job_dir: Path, environ: dict[str, str]):
        self.files = JobDir(job_dir)
        self.files.logs.mkdir(parents=True, exist_ok=True)
        self._environ = {
            **environ,
            PARENT_ENV: str(os.getpid()),  # arms the lifeline: they die with this process
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
        }
        # The caller starts it, watches its socket (`pump`) and restarts it.
        self.fork_server = ForkServerLink(
            job_dir, self.files.logs / "forkserver.log", self._environ
        )
        self._live: dict[int, tuple[tuple[str, int], Process]] = {}  # by pid
        self.states: dict[tuple[str, int], Event] = {}  # the last event of each instance

    def launch(self, role: str, instance_id: int, env: dict[str, str]) -> Event:
        """Start `python -m elasticdl_nb.runtime.<role> --id <instance_id>` with `env`
        added to the environment; returns its `started` event."""
        if role not in (Role.WORKER, Role.PS):
            raise ValueError(f"no such role to launch: {role!r}")
        key = (role, instance_id)
        older = self._current(key)
        if older is not None:  # one process per instance: the newer launch wins
            log.warning("%s %d: pid %d still runs; killing it first", role, instance_id, older)
            os.kill(older, signal.SIGKILL)
        proc = self._start(role, instance_id, env)
        self._live[proc.pid] = (key, proc)
        event = _event(key, InstanceState.STARTED, pid=proc.pid)
        self.states[key] = event
        return event

    def _start(self, role: str, instance_id: int, env: dict[str, str]) -> Process:
        log_path = self.files.log(role, instance_id)
        if self.fork_server.state is ServerState.READY:
            try:
                return self.fork_server.fork(role, instance_id, env, log_path)
            except OSError as exc:
                log.warning("%s %d: %s; starting a new interpreter", role, instance_id, exc)
        with open(log_path, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", f"elasticdl_nb.runtime.{role}", "--id", str(instance_id)],
                env={**self._environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )

    def reap(self) -> list[Event]:
        """The end events of the instances that ended since the last call (not of one
        that a newer launch of the same instance replaced)."""
        ended = []
        for pid, (key, proc) in list(self._live.items()):
            code = proc.poll()
            if code is None:
                continue
            del self._live[pid]
            event = _end_event(key, code, pid)
            if self.states[key].get("pid") != pid:
                log.info("%s %d (pid %d, replaced) %s", *key, pid, event["reason"])
                continue
            self.states[key] = event
            ended.append(event)
        return ended

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        pid = self._current((role, instance_id))
        if pid is not None:
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)

    def live(self) -> list[Process]:
        return [proc for _, proc in self._live.values() if proc.returncode is None]

    def _current(self, key: tuple[str, int]) -> int | None:
        """The pid of the live process of instance `key`, if there is one."""
        pid = self.states.get(key, {}).get("pid")
        if pid in self._live and self._live[pid][1].poll() is None:
            return pid
        return None


def _event(key: tuple[str, int], kind: InstanceState, **fields: Any) -> Event:
    return {"role": key[0], "instance_id": key[1], "kind": str(kind), **fields}


def _end_event(key: tuple[str, int], code: int, pid: int) -> Event:
    """How a process ended, from its wait status as `Popen.returncode` gives it."""
    if code == 0:
        return _event(key, InstanceState.SUCCEEDED, exit_code=0, pid=pid)
    if code < 0:
        name = signal.Signals(-code).name
        return _event(key, InstanceState.KILLED, signal=name, pid=pid, reason=f"killed by {name}")
    return _event(
        key, InstanceState.FAILED, exit_code=code, pid=pid, reason=f"exited with code {code}"
    )


def terminate(procs: list[subprocess.Popen], grace_seconds: float) -> None:
    """SIGTERM every live process, then SIGKILL whichever is still there after the grace
    period (one deadline for all of them)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_seconds
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
