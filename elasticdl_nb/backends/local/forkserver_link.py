"""The supervisor's end of its job's fork server (`forkserver.py`): getting one (from the
user's warm pool, `warm_pool.py`, else as a new interpreter), asking it for an instance's
process, and hearing how each one ended.

`ForkedProcess` is the part of `subprocess.Popen` that `LocalProcesses` uses, so a forked
instance and one started with `Popen` (before the server is ready, or if it is gone) are
handled alike. Standard library only, like the rest of the supervisor.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from elasticdl_nb.backends.local.supervisor_protocol import (
    LineReader,
    encode,
    start_talking_child,
)
from elasticdl_nb.backends.local.warm_pool_link import ask_for_fork_server, pool_socket

log = logging.getLogger("elasticdl_nb.supervisor")

FORK_SERVER_MODULE = "elasticdl_nb.backends.local.forkserver"
FORK_SERVER_FD_ENV = "ELASTICDL_NB_FORK_SERVER_FD"  # the server's end of the socketpair
FORK_REPLY_TIMEOUT = 10.0  # a fork takes milliseconds; more means the server is stuck


class ServerState(enum.Enum):
    OFF = "off"  # not started, or given up on
    STARTING = "starting"  # importing
    READY = "ready"
    DEAD = "dead"  # it ended; the supervisor closes it (and may start another)


class ForkedProcess:
    """An instance forked by the fork server: its pid, and its end once the server (or
    the server's death) told it."""

    def __init__(self, pid: int, link: ForkServerLink):
        self.pid = pid
        self.returncode: int | None = None
        self._link = link

    def poll(self) -> int | None:
        if self.returncode is None:
            self._link.pump()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # it ended; the server's word on it is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class PooledServer:
    """A fork server that the warm pool forked: the pool's child, not ours. It is
    signalled through a pidfd (so a pid that another process took since is never
    signalled); how it ended is not ours to know: its socket's end says that it did."""

    def __init__(self) -> None:
        self.pid = -1  # until its `ready` names it
        self._pidfd: int | None = None

    def found(self, pid: int) -> None:
        self.pid = pid
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # it is gone already: its socket says so next
            self._pidfd = None

    def poll(self) -> int | None:
        return None

    def kill(self) -> None:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class ForkServerLink:
    def __init__(self, job_dir: Path, log_path: Path, environ: dict[str, str]):
        self.job_dir = job_dir
        self.log_path = log_path
        self.environ = environ
        self.state = ServerState.OFF
        self.ever_ready = False  # the one it runs (or ran) got as far as ready
        self.pooled = False  # the one it runs came from the warm pool
        self.proc: subprocess.Popen | PooledServer | None = None
        self.sock: socket.socket | None = None
        self._reader = LineReader()
        self._children: dict[int, ForkedProcess] = {}
        self._forked: list[dict[str, Any]] = []  # replies to `fork`, in order

    def start(self) -> None:
        """Ask the user's warm pool for a fork server (starting the pool if there is
        none: it imports while this job's master starts, as a new interpreter would);
        where there can be no pool, or it fails, start one as a new interpreter."""
        self._reader, self.ever_ready = LineReader(), False
        pool = pool_socket(self.environ, sys.path)
        if pool is not None:
            env = {**self.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"}  # (as below)
            try:
                ours = ask_for_fork_server(pool, env, self.job_dir, self.log_path)
            except OSError as exc:
                log.warning("warm pool %s: %s; the fork server starts on its own", pool, exc)
            else:
                self.proc, self.pooled = PooledServer(), True
                self._started(ours)
                log.info("fork server asked of the warm pool at %s", pool)
                return
        args = ["--job-dir", str(self.job_dir)]
        self.proc, ours = start_talking_child(
            FORK_SERVER_MODULE, args, self.environ, self.log_path, FORK_SERVER_FD_ENV
        )
        self.pooled = False
        self._started(ours)
        log.info("fork server started (pid %d)", self.proc.pid)

    def _started(self, ours: socket.socket) -> None:
        ours.setblocking(False)
        self.sock, self.state = ours, ServerState.STARTING

    def stop(self) -> None:
        """End the server (it runs nothing of its own: SIGKILL is enough) and let go."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def close(self) -> None:
        """Let go of a server that ended (the supervisor unregistered its socket)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            self.proc.wait()
        self.state = ServerState.OFF

    def pump(self) -> None:
        """Take in whatever the server has said, without waiting."""
        if self.sock is None or self.state is ServerState.DEAD:
            return
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._died()
                return
            for message in self._reader.feed(data):
                self._take(message)

    def fork(self, role: str, instance_id: int, env: dict[str, str], log: Path) -> ForkedProcess:
        """A new process for the instance, forked by the (ready) server. Raises OSError
        if the server refused, or is gone (it is DEAD then)."""
        request = {"op": "fork", "role": role, "id": instance_id, "env": env, "log": str(log)}
        try:
            self.sock.sendall(encode(request))
        except OSError as exc:  # (a full socket too: the server stopped reading)
            self._died()
            raise OSError(f"the fork server is gone: {exc}") from None
        deadline = time.monotonic() + FORK_REPLY_TIMEOUT
        while not self._forked and self.state is ServerState.READY:
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("the fork server did not answer in %.0f s: SIGKILL", FORK_REPLY_TIMEOUT)
                self.proc.kill()
                self.proc.wait()
                self._died()
                break
            select.select([self.sock], [], [], left)
            self.pump()
        if not self._forked:
            raise OSError("the fork server ended before it forked")
        reply = self._forked.pop(0)
        if "error" in reply:
            raise OSError(f"the fork server could not fork: {reply['error']}")
        child = ForkedProcess(reply["pid"], self)
        self._children[child.pid] = child
        return child

    def _take(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "ready":
            self.state = ServerState.READY
            self.ever_ready = True
            if isinstance(self.proc, PooledServer):
                self.proc.found(message["pid"])
            log.info("fork server ready (pid %d)", self.proc.pid)
        elif op == "forked":
            self._forked.append(message)
        elif op == "ended":
            child = self._children.pop(message["pid"], None)
            if child is not None:
                child.returncode = message["returncode"]

    def _died(self) -> None:
        """The server ended: each of its instances died with it (their lifeline)."""
        was = self.state
        self.state = ServerState.DEAD
        code = self.proc.poll() if self.proc else None
        log.error(
            "fork server (pid %d) ended%s%s; its %d running instances with it",
            self.proc.pid if self.proc else -1,
            f" (code {code})" if code is not None else "",
            " before it was ready" if was is ServerState.STARTING else "",
            len(self._children),
        )
        for child in self._children.values():
            child.returncode = -signal.SIGKILL
        self._children.clear()
