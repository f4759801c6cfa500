"""A local job's supervisor: `python -m elasticdl_nb.backends.local.supervisor --job-dir D`.

The one process whose life is the job's. `submit.start_master` starts it in a session of
its own; it runs the master as its child and, on the master's request, the workers and
PS (`processes.py`), so that a master that dies leaves them running: the supervisor
starts a new master (the next incarnation), which finds them again (`adopt`), and they
reach it at the same address (`master_site.master_address`). What the two say to each
other is `supervisor_protocol.py`.

- The master exits and the job is over (it wrote `state.json`): the workers and PS left
  are ended and the supervisor exits.
- It exits otherwise: a new master starts after `RESTART_DELAY`, at most `MAX_RESTARTS`
  times; then the job fails, with the master's last log lines as the cause. (A first
  master that never served is not restarted: the job could not start, and
  `start_master` says why.)
- SIGTERM or SIGINT (how `kill_job` stops a job): no more restarts; the master gets
  `MASTER_STOP_GRACE` to stop the job and record it, then SIGKILL; then the rest ends.
- SIGKILL: every process of the job asked the kernel to die with the supervisor
  (`runtime.lifeline`), so none is left behind.

One thread does everything (a select loop), because the kernel ties a child's death
signal to the thread that forked it. Nothing here imports gRPC or TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from elasticdl_nb.backends.job_records import MASTER_MODULE
from elasticdl_nb.backends.local.forkserver_link import ServerState
from elasticdl_nb.backends.local.processes import Event, LocalProcesses
from elasticdl_nb.backends.local.supervisor_protocol import (
    INCARNATION_ENV,
    SUPERVISOR_FD_ENV,
    SUPERVISOR_PID_ENV,
    LineReader,
    drain,
    encode,
    start_talking_child,
    wake_on_signals,
)
from elasticdl_nb.runtime.job_dir import SUPERVISOR, JobDir, read_json, write_json
from elasticdl_nb.runtime.lifeline import PARENT_ENV
from elasticdl_nb.runtime.logs import setup_logging
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.vocabulary import EventKind, JobState, Role

log = logging.getLogger("elasticdl_nb.supervisor")

MAX_RESTARTS = 20
RESTART_DELAY = 0.3  # seconds: a master that dies at once does not spin the machine
MASTER_STOP_GRACE = 20.0  # its own shutdown takes up to ~10 s (drain, grace, server stop)
LEFTOVER_GRACE = 5.0  # for workers and PS still running when the job is over


class MasterConnection:
    """The supervisor's end of one master's socketpair, non-blocking: a master that does
    not read (stopped, busy) never blocks the supervisor."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.setblocking(False)
        self.reader = LineReader()
        self.outgoing = bytearray()
        self.listening = False  # events go to a master once it has sent a request

    def reply(self, req: int | None, fields: dict[str, Any]) -> None:
        """The answer to request number `req` (`{"error": ...}` when it failed)."""
        self.send({"op": "reply", "req": req, **fields})

    def send(self, message: dict[str, Any]) -> None:
        self.outgoing += encode(message)
        self.flush()

    def flush(self) -> None:
        try:
            while self.outgoing:
                del self.outgoing[: self.sock.send(self.outgoing)]
        except (BlockingIOError, InterruptedError):
            pass  # the rest goes when the socket is writable again
        except OSError:
            self.outgoing.clear()  # the master is gone; its exit is handled on its own


class Supervisor:
    def __init__(self, job_dir: Path, master_module: str = MASTER_MODULE):
        self.job_dir = job_dir
        self.files = JobDir(job_dir)
        self.master_module = master_module
        # What every child starts from: this process's environment, less what is meant
        # for the master only.
        self.environ = {
            k: v
            for k, v in os.environ.items()
            if k not in (SUPERVISOR_FD_ENV, SUPERVISOR_PID_ENV, INCARNATION_ENV, PARENT_ENV)
        }
        self.processes = LocalProcesses(job_dir, self.environ)
        self.selector = selectors.DefaultSelector()
        self.master: subprocess.Popen | None = None
        self.connection: MasterConnection | None = None
        self.incarnation = -1
        self.restart_at: float | None = None
        self.stopping = ""  # the signal that asked us to stop
        self.master_kill_at: float | None = None
        self.exit_code: int | None = None  # set: the loop ends
        # Launches asked for while the fork server imports: answered once it is ready
        # (sooner than a new interpreter would be) or gone.
        self.waiting_launches: list[tuple[MasterConnection, dict[str, Any]]] = []
        self.fork_server_restarts = 0

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        # A signal wakes the select below; a child that ended: wake up and reap.
        self.wake = wake_on_signals(signal.SIGCHLD)
        wake_read = self.wake[0]
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop_signal)
        self.selector.register(wake_read, selectors.EVENT_READ, "wake")
        self._start_master()
        self._start_fork_server()  # (a new one imports while the master starts)
        while self.exit_code is None:
            for key, mask in self.selector.select(self._timeout()):
                if key.data == "wake":
                    drain(wake_read)
                elif key.data == "fork server":
                    self.processes.fork_server.pump()
                elif key.data is self.connection:
                    self._serve(self.connection, mask)
            self._watch_fork_server()
            self._reap()
            self._tick()
        return self.exit_code

    def _timeout(self) -> float:
        # Also a safety net: children are polled at least twice a second.
        due = [t for t in (self.restart_at, self.master_kill_at) if t is not None]
        return max(0.0, min([time.monotonic() + 0.5, *due]) - time.monotonic())

    def _tick(self) -> None:
        now = time.monotonic()
        if self.stopping and self.master is None:
            self._finish()
        elif self.master is not None and self.master.poll() is not None:
            self._master_exited()
        elif self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self._start_master()
        elif self.master_kill_at is not None and now >= self.master_kill_at:
            log.warning("master did not stop within %.0f s: SIGKILL", MASTER_STOP_GRACE)
            self.master.kill()
            self.master_kill_at = None

    def _on_stop_signal(self, signum: int, _frame) -> None:
        if self.stopping:
            return
        self.stopping = signal.Signals(signum).name
        self.restart_at = None
        if self.master is not None and self.master.poll() is None:
            # It may have had the signal already (kill_job signals the whole group): once
            # more does no harm, and it is what stops a master whose supervisor alone was
            # signalled.
            self.master.send_signal(signal.SIGTERM)
            self.master_kill_at = time.monotonic() + MASTER_STOP_GRACE

    # ------------------------------------------------------------------ the fork server

    def _start_fork_server(self) -> None:
        server = self.processes.fork_server
        server.start()
        self.selector.register(server.sock, selectors.EVENT_READ, "fork server")

    def _watch_fork_server(self) -> None:
        """Answer the launches that waited for it once it is ready; when it died, start
        another (if it had been ready: one that cannot start is not tried again)."""
        server = self.processes.fork_server
        if server.state is ServerState.DEAD:
            self.selector.unregister(server.sock)
            was_ready = server.ever_ready
            server.close()
            if was_ready and not self.stopping and self.fork_server_restarts < MAX_RESTARTS:
                self.fork_server_restarts += 1
                self._start_fork_server()
            else:
                log.warning("no fork server from now on: instances start as new interpreters")
        if server.state is not ServerState.STARTING:
            waiting, self.waiting_launches = self.waiting_launches, []
            for connection, request in waiting:
                if connection is self.connection:  # (a new master relaunches what it needs)
                    self._handle(connection, request)

    # ------------------------------------------------------------------ the master

    def _start_master(self) -> None:
        self.incarnation += 1
        env = {
            **self.environ,
            SUPERVISOR_PID_ENV: str(os.getpid()),
            INCARNATION_ENV: str(self.incarnation),
        }
        args = ["--job-dir", str(self.job_dir)]
        log_path = self.files.log(Role.MASTER)
        self.master, ours = start_talking_child(
            self.master_module, args, env, log_path, SUPERVISOR_FD_ENV
        )
        self.connection = MasterConnection(ours)
        self.selector.register(ours, selectors.EVENT_READ, self.connection)
        log.info("master incarnation %d started (pid %d)", self.incarnation, self.master.pid)

    def _master_exited(self) -> None:
        master, self.master, self.master_kill_at = self.master, None, None
        self._disconnect()
        how = _how_it_ended(master.returncode)
        if self.files.state.exists():
            log.info("master (pid %d) %s; the job is over", master.pid, how)
            self._finish()
        elif self.stopping:
            log.info("master (pid %d) %s while stopping (%s)", master.pid, how, self.stopping)
            if self._served():
                self._record_end(
                    JobState.STOPPED,
                    f"stopped by {self.stopping}; the master {how} without recording the end",
                )
            self._finish()
        elif not self._served():
            log.error("master (pid %d) %s before it served; the job did not start", master.pid, how)
            self._finish(exit_code=_exit_code(master.returncode))
        elif self.incarnation >= MAX_RESTARTS:
            log.error(
                "master (pid %d) %s; no restart left (%d used)", master.pid, how, MAX_RESTARTS
            )
            tail = self.files.log_tail(Role.MASTER, lines=10)
            self._record_end(
                JobState.FAILED,
                f"the master died {MAX_RESTARTS + 1} times; the last one {how}. "
                f"The last lines of its log (job.logs('master')):\n{tail}",
            )
            self._finish(exit_code=1)
        else:
            log.warning(
                "master incarnation %d (pid %d) %s; restarting it in %.1f s (restart %d of %d)",
                self.incarnation,
                master.pid,
                how,
                RESTART_DELAY,
                self.incarnation + 1,
                MAX_RESTARTS,
            )
            self.restart_at = time.monotonic() + RESTART_DELAY

    def _served(self) -> bool:
        """Whether a master of this supervisor has ever served (written master.json)."""
        master = read_json(self.files.master) or {}
        return master.get("supervisor_pid") == os.getpid()

    def _disconnect(self) -> None:
        if self.connection is not None:
            self.selector.unregister(self.connection.sock)
            self.connection.sock.close()
            self.connection = None

    def _record_end(self, state: JobState, error: str) -> None:
        """The job's end state, when no master recorded it: the journal's last event (no
        master writes to it now), then state.json."""
        journal = Journal(self.files.events)
        journal.append(EventKind.JOB_STATE, state=state, reason=error, recorded_by="supervisor")
        journal.close()
        status = {"name": self.job_dir.name, "state": state, "error": error, "ended": time.time()}
        write_json(self.files.state, status)

    def _finish(self, exit_code: int = 0) -> None:
        """End the workers and PS still running, then the loop."""
        self._end_instances(LEFTOVER_GRACE)
        server = self.processes.fork_server
        if server.sock is not None:
            self.selector.unregister(server.sock)
        server.stop()
        log.info("supervisor exits")
        self.exit_code = exit_code

    # ------------------------------------------------------------------ requests

    def _serve(self, connection: MasterConnection, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            connection.flush()
        if mask & selectors.EVENT_READ:
            try:
                data = connection.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":  # the master closed its end: it is exiting
                self.selector.unregister(connection.sock)
                self.connection = None
                connection.sock.close()
                return
            for request in connection.reader.feed(data or b""):
                connection.listening = True
                self._handle(connection, request)
        if self.connection is connection:
            wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if connection.outgoing else 0)
            self.selector.modify(connection.sock, wanted, connection)

    def _handle(self, connection: MasterConnection, request: dict[str, Any]) -> None:
        op, req = request.get("op"), request.get("req")
        if op == "launch" and self.processes.fork_server.state is ServerState.STARTING:
            self.waiting_launches.append((connection, request))
            return
        try:
            if op == "launch":
                event = self.processes.launch(request["role"], request["id"], request["env"])
                log.info(
                    "%s %d started (pid %d)", event["role"], event["instance_id"], event["pid"]
                )
                self._report([event])
                reply: dict[str, Any] = {"pid": event["pid"]}
            elif op == "kill":
                self.processes.kill(request["role"], request["id"], request.get("force", False))
                reply = {}
            elif op == "shutdown":
                self._end_instances(float(request.get("grace", LEFTOVER_GRACE)))
                reply = {}
            elif op == "adopt":
                self._report(list(self.processes.states.values()))
                reply = {"known": sorted(self.processes.states)}
                log.info("master incarnation %d adopts %d", self.incarnation, len(reply["known"]))
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as exc:  # e.g. a launch the OS refused: the master decides
            log.error("%s request failed: %s", op, exc)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        connection.reply(req, reply)

    def _reap(self) -> None:
        for event in self.processes.reap():
            role, instance_id, pid = event["role"], event["instance_id"], event["pid"]
            log.info(
                "%s %d (pid %d) %s", role, instance_id, pid, event.get("reason") or event["kind"]
            )
            self._report([event])

    def _report(self, events: list[Event]) -> None:
        """Tell the master (if one listens) what happened; `processes` keeps it anyway."""
        for event in events:
            if self.connection is not None and self.connection.listening:
                self.connection.send({"op": "event", **event})

    def _end_instances(self, grace_seconds: float) -> None:
        """SIGTERM every worker and PS, SIGKILL those left after the grace period, and
        report each end as it comes (reaping blocks this loop meanwhile: the master asked
        for it and waits, or it is gone)."""
        waiting, self.waiting_launches = self.waiting_launches, []
        for connection, request in waiting:  # (none starts after this)
            connection.reply(request.get("req"), {"error": "the job is ending"})
        live = self.processes.live()
        for proc in live:
            proc.terminate()
        deadline = time.monotonic() + grace_seconds
        while self.processes.live():
            if time.monotonic() >= deadline:
                for proc in self.processes.live():
                    proc.kill()
                deadline = float("inf")
            time.sleep(0.05)
            self._reap()


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def _exit_code(returncode: int) -> int:
    """A child's end as an exit code of ours (killed by signal N: 128 + N, as a shell)."""
    return 128 - returncode if returncode < 0 else returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument(
        "--master-module",
        default=MASTER_MODULE,
        help="what to run as the master (`python -m MODULE --job-dir D`); tests use a stand-in",
    )
    args = parser.parse_args()
    setup_logging(SUPERVISOR)
    log.info("supervisor of %s (pid %d)", args.job_dir, os.getpid())
    sys.exit(Supervisor(args.job_dir, args.master_module).run())


if __name__ == "__main__":
    main()
