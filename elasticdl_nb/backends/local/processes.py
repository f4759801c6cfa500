"""Worker and PS processes of a local job, launched and watched by the master.

Each instance is a child of the master (so its exit code or signal is known exactly) in
the master's own session, and asks the kernel to kill it if the master dies (see
`elasticdl_nb.runtime.lifeline`), so a job never leaves processes behind, however the
master ends. The kernel ties that signal to the *thread* that forked, so every process is
forked from one long-lived spawner thread, never from a short-lived one (a watcher, a timer).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.lifeline import PARENT_ENV
from elasticdl_nb.runtime.master.site import EventSink, InstanceEvent
from elasticdl_nb.vocabulary import InstanceState


class LocalProcesses:
    def __init__(self, job_dir: Path, env: dict[str, str], on_event: EventSink):
        self.files = JobDir(job_dir)
        self.files.logs.mkdir(parents=True, exist_ok=True)
        self._env = {
            **os.environ,
            **env,
            PARENT_ENV: str(os.getpid()),  # arms the lifeline: they die with this master
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
        }
        self._on_event = on_event
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="spawner")

    def _spawn(self, role: str, instance_id: int) -> subprocess.Popen:
        log_path = self.files.log(role, instance_id)
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", f"elasticdl_nb.runtime.{role}", "--id", str(instance_id)],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )

    def launch(self, role: str, instance_id: int) -> None:
        proc = self._spawner.submit(self._spawn, role, instance_id).result()
        with self._lock:
            self._procs[(role, instance_id)] = proc
        self._on_event(InstanceEvent(role, instance_id, InstanceState.STARTED, pid=proc.pid))
        threading.Thread(
            target=self._watch,
            args=(role, instance_id, proc),
            daemon=True,
            name=f"watch-{role}-{instance_id}",
        ).start()

    def _watch(self, role: str, instance_id: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self._lock:
            if self._procs.get((role, instance_id)) is proc:
                del self._procs[(role, instance_id)]
        if code == 0:
            event = InstanceEvent(
                role, instance_id, InstanceState.SUCCEEDED, exit_code=0, pid=proc.pid
            )
        elif code < 0:
            name = signal.Signals(-code).name
            event = InstanceEvent(
                role,
                instance_id,
                InstanceState.KILLED,
                signal=name,
                pid=proc.pid,
                reason=f"killed by {name}",
            )
        else:
            event = InstanceEvent(
                role,
                instance_id,
                InstanceState.FAILED,
                exit_code=code,
                pid=proc.pid,
                reason=f"exited with code {code}",
            )
        self._on_event(event)

    def grow_memory(self, role: str) -> str | None:
        return None  # local processes have no memory limit to raise

    def pid(self, role: str, instance_id: int) -> int | None:
        with self._lock:
            proc = self._procs.get((role, instance_id))
            return proc.pid if proc else None

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        with self._lock:
            proc = self._procs.get((role, instance_id))
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL if force else signal.SIGTERM)

    def shutdown(self, grace_seconds: float) -> None:
        """SIGTERM everything, then SIGKILL what is still there after the grace period."""
        with self._lock:
            procs = list(self._procs.values())
        terminate(procs, grace_seconds)


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
