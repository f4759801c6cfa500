"""A user's warm pool: `python -m elasticdl_nb.backends.local.warm_pool --socket S --idle T`.

Every local job needs a fork server (`forkserver.py`), and a fork server's start is
importing TensorFlow: 3.5-6 s on this machine kind, which a notebook user paid on each
run of a training cell, and the test suite on each of its jobs. A pool imports it once
and forks, for each job that asks, a process that is that job's fork server at once.

The first job that finds no pool starts one (`warm_pool_link.py`); it serves the user's
later jobs until it has had no request for `--idle` seconds (15 minutes by default,
`ELASTICDL_NB_WARM_POOL_IDLE`; 0 turns pools off), or until the files it imported
change: it exits then, and the next job starts a pool of the new code. It listens on a
socket in an owner-only directory and answers only callers of its own uid: the job's
environment, its token included, comes over that socket. It runs nothing of a job in
itself; a fork server it forked is the job's alone:

- it leaves the pool's session, takes the job's environment, working directory and
  `sys.path`, and writes to the job's fork-server log;
- its connection is its supervisor's end: when the supervisor dies, the connection
  closes and it exits, and the job's workers and PS with it (their lifeline is it);
- the pool going (idle, stale, killed) takes no fork server with it.

One thread, a select loop, like the supervisor: nothing here starts a thread before it
forks, as forking a process that runs threads is unsafe.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import setproctitle

from elasticdl_nb.backends.local.forkserver import ForkServer, exit_code, preload, reap
from elasticdl_nb.backends.local.forkserver_link import FORK_SERVER_MODULE
from elasticdl_nb.backends.local.supervisor_protocol import drain, wake_on_signals
from elasticdl_nb.backends.local.warm_pool_link import fingerprint

REQUEST_SECONDS = 5.0  # a caller sends its request as soon as it connects
LOCK_SECONDS = 3.0  # a pool that is leaving lets go of its lock in milliseconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, type=Path, help="where to listen")
    parser.add_argument("--idle", type=float, required=True, help="seconds without a job")
    parser.add_argument("--check", type=float, required=True, help="seconds between checks")
    args = parser.parse_args()
    if os.fork():  # the starter waits for this first process only: it leaves at once
        os._exit(0)
    lock = _lock(args.socket)
    if lock is None:
        print(f"another pool serves {args.socket}: leaving", flush=True)
        return
    listener = _listen(args.socket)
    # (its TMPDIR, which warm_pool_link makes the pool's own; an import may write there)
    if os.environ.get("TMPDIR"):
        Path(os.environ["TMPDIR"]).mkdir(mode=0o700, exist_ok=True)
    # What the key is of: the environment and path it started with (an import may add
    # to its own environment; the files are what can change under it).
    environ, path = dict(os.environ), list(sys.path)
    key = fingerprint(environ, path)
    started = time.monotonic()
    preload()
    print(
        f"pool {os.getpid()} for {args.socket} ready in {time.monotonic() - started:.1f} s",
        flush=True,
    )
    setproctitle.setproctitle(f"{sys.executable} -m {__spec__.name} --socket {args.socket}")
    WarmPool(listener, lock, args.socket, (environ, path, key), args.idle, args.check).run()


def _lock(sock_path: Path) -> int | None:
    """One pool per socket: an exclusive lock on the socket's lock file, held while the
    pool lives (and by none of its children: they close it). None if another pool has
    it and serves; a pool that holds it without its socket is leaving: wait for it."""
    fd = os.open(sock_path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # who serves here (`running_pools`)
            return fd
        except BlockingIOError:
            if sock_path.exists() or time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def _listen(path: Path) -> socket.socket:
    """Listen at `path` (a stale socket file of a pool that died is replaced). Callers
    connect now and wait in the backlog while the imports run."""
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(64)
    return listener


class WarmPool:
    def __init__(
        self,
        listener: socket.socket,
        lock: int,
        path: Path,
        fitting: tuple[dict[str, str], list[str], str],
        idle: float,
        check: float,
    ):
        self.listener = listener
        self.lock = lock
        self.path = path
        self.fitting = fitting  # (environment, sys.path, their fingerprint) at the start
        self.idle = idle
        self.check = check  # seconds between checks that the files it imported are current
        self.children: set[int] = set()
        self.last_request = time.monotonic()

    def run(self) -> None:
        self._wake = wake_on_signals(signal.SIGCHLD)  # a fork server ended: reap it
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ, "listener")
        selector.register(self._wake[0], selectors.EVENT_READ, "wake")
        next_check = time.monotonic() + self.check
        while True:
            for key, _ in selector.select(min(next_check, self._idle_until()) - time.monotonic()):
                if key.data == "wake":
                    drain(self._wake[0])
                else:
                    self._accept()
            self._reap()
            now = time.monotonic()
            if now >= self._idle_until():
                return self._leave(f"no job for {self.idle:.0f} s")
            if now >= next_check:
                next_check = now + self.check
                environ, path, key = self.fitting
                if fingerprint(environ, path) != key:
                    return self._leave("the files it imported changed")

    def _idle_until(self) -> float:
        return self.last_request + self.idle

    def _leave(self, why: str) -> None:
        # The socket goes first: a job that comes now starts a new pool (which waits
        # for this one's lock). No other pool can have replaced it: we hold the lock.
        self.path.unlink(missing_ok=True)
        print(f"pool {os.getpid()} leaves: {why}", flush=True)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.last_request = time.monotonic()
        try:
            if _peer_uid(conn) != os.getuid():
                raise PermissionError("a caller of another uid")
            request = _read_request(conn)
            pid = os.fork()
        except (OSError, ValueError) as exc:
            print(f"refused a request: {type(exc).__name__}: {exc}", flush=True)
            conn.close()
            return
        if pid == 0:
            self._become_fork_server(conn, request)
        conn.close()
        self.children.add(pid)

    def _become_fork_server(self, conn: socket.socket, request: dict[str, Any]) -> None:
        """In the child: the job's fork server, as `forkserver.main` would be in a new
        interpreter with the job's environment. Never returns."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for end in (self.listener, *self._wake):
                end.close()
            os.close(self.lock)  # (or the pool's lock would outlive the pool)
            os.setsid()  # out of the pool's session: nothing sent to the pool reaches jobs
            log_fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(log_fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            # Python caches its temporary directory at first use (TensorFlow's import
            # used it in the pool): the job's own, where autograph writes the model's
            # converted source, not the pool's.
            tempfile.tempdir = None
            sys.path[:] = request["path"]
            # What `ps` shows, and what finds a job's processes: the command it stands for.
            job_dir = request["job_dir"]
            setproctitle.setproctitle(
                f"{sys.executable} -m {FORK_SERVER_MODULE} --job-dir {job_dir} (warm pool)"
            )
            print(f"fork server of {job_dir}, forked by warm pool {os.getppid()}", flush=True)
            ForkServer(conn, job_dir).run()
        except SystemExit as exc:
            code = exit_code(exc.code)
        except BaseException:  # noqa: BLE001 - the child's end: say why, in its log
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _reap(self) -> None:
        for _ in reap(self.children):
            pass  # (nobody is told: a fork server's end reaches its supervisor itself)


def _peer_uid(conn: socket.socket) -> int:
    ucred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", ucred)[1]


def _read_request(conn: socket.socket) -> dict[str, Any]:
    """The one line a caller sends first; nothing after it is read here (it is the fork
    server's)."""
    conn.settimeout(REQUEST_SECONDS)
    line = b""
    while not line.endswith(b"\n"):
        byte = conn.recv(1)  # byte by byte: what follows the line is not ours to read
        if not byte:
            raise ValueError("the caller left before its request")
        line += byte
    conn.settimeout(None)
    request = json.loads(line)
    if request.get("op") != "fork server":
        raise ValueError(f"not a request for a fork server: {request.get('op')!r}")
    return request


if __name__ == "__main__":
    main()
