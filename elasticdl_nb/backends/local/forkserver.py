"""A local job's fork server: `python -m elasticdl_nb.backends.local.forkserver --job-dir D`.

A worker or PS spends most of its start importing TensorFlow: about 4.5 CPU-seconds on
this machine kind, the same again for every relaunch. Under faults that is most of what a
replacement costs the job (a worker killed every 20 s on two cores: a tenth of the
machine), and at a job's start the workers and PS import it all at once. The supervisor
starts this process once per job; it imports what workers and PS import, runs none of it
(no op, no gRPC channel), and forks a ready process for each launch, which then runs the
instance's `__main__` as `python -m` would (FACTS.md: a forked worker trains a Keras model
after 0.46 CPU-s).

The supervisor talks to it over a socketpair (its fd in `FORK_SERVER_FD_ENV`), in JSON
lines (`supervisor_protocol.encode`):

    server -> supervisor   {"op": "ready", "pid": 4200}          once the imports are done
    supervisor -> server   {"op": "fork", "role": "worker", "id": 3, "env": {...},
                            "log": "/job/logs/worker-3.log"}
    server -> supervisor   {"op": "forked", "pid": 4242}           (or {"op": "forked",
                                                                     "error": "..."})
    server -> supervisor   {"op": "ended", "pid": 4242, "returncode": -9}
                           (`Popen.returncode`'s convention: -N for killed by signal N)

Each instance is this process's child, so it reaps them and says how each ended; each
one's lifeline points here (`runtime.lifeline`), and this process's lifeline points at
the supervisor: the supervisor's death still takes every process of the job with it. If
this process dies alone, its instances die with it and the supervisor reports them killed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import setproctitle

from elasticdl_nb.backends.local.forkserver_link import FORK_SERVER_FD_ENV
from elasticdl_nb.backends.local.supervisor_protocol import (
    LineReader,
    drain,
    encode,
    wake_on_signals,
)
from elasticdl_nb.runtime.heap import keep_freed_memory
from elasticdl_nb.runtime.lifeline import PARENT_ENV, die_with_parent
from elasticdl_nb.vocabulary import Role

# What a worker and a PS import, to be imported once here. Importing runs no TensorFlow
# op and starts no gRPC: a forked child may use both as if it had imported them itself.
PRELOAD = (
    "numpy",
    "tensorflow",
    "keras",
    "elasticdl_nb.model",
    "elasticdl_nb.runtime.worker.process",
    "elasticdl_nb.runtime.worker.trainer",
    "elasticdl_nb.runtime.worker.model_runner",
    "elasticdl_nb.runtime.ps.process",
    "elasticdl_nb.runtime.ps.store",
)


def main() -> None:
    die_with_parent()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-dir", required=True, help="the job's directory")
    args = parser.parse_args()
    sock = socket.socket(fileno=int(os.environ.pop(FORK_SERVER_FD_ENV)))
    preload()
    ForkServer(sock, args.job_dir).run()


def preload() -> None:
    """What a fork server does before it serves (and a warm pool before it forks one)."""
    # Before the imports start threads: the children inherit one malloc arena (heap.py).
    keep_freed_memory()
    for module in PRELOAD:
        importlib.import_module(module)


class ForkServer:
    def __init__(self, sock: socket.socket, job_dir: str):
        self.sock = sock
        self.job_dir = job_dir
        self.reader = LineReader()
        self.children: set[int] = set()

    def run(self) -> None:
        self._wake = wake_on_signals(signal.SIGCHLD)  # a child ended: wake up and reap
        wake_read = self._wake[0]
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, "supervisor")
        selector.register(wake_read, selectors.EVENT_READ, "wake")
        self.sock.sendall(encode({"op": "ready", "pid": os.getpid()}))
        while True:
            for key, _ in selector.select(1.0):
                if key.data == "wake":
                    drain(wake_read)
                    continue
                data = self.sock.recv(65536)
                if not data:  # the supervisor is gone (our lifeline kills us anyway)
                    os._exit(0)
                for request in self.reader.feed(data):
                    self.sock.sendall(encode(self._fork(request)))
            self._reap()

    def _fork(self, request: dict[str, Any]) -> dict[str, Any]:
        role = request.get("role")
        if request.get("op") != "fork" or role not in (Role.WORKER, Role.PS):
            return {"op": "forked", "error": f"not a fork request: {request}"}
        try:
            log_fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            return {"op": "forked", "error": f"{type(exc).__name__}: {exc}"}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing of ours buffered for a child to write again
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(log_fd)
            return {"op": "forked", "error": f"{type(exc).__name__}: {exc}"}
        if pid == 0:
            self._become(role, int(request["id"]), request.get("env") or {}, log_fd)
        os.close(log_fd)
        self.children.add(pid)
        return {"op": "forked", "pid": pid}

    def _become(self, role: str, instance_id: int, env: dict[str, str], log_fd: int) -> None:
        """In the child: become `python -m elasticdl_nb.runtime.<role> --id N`, with `env`
        added to the environment and its output in the instance's log. Never returns."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for end in (self.sock, *self._wake):
                end.close()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(devnull)
            os.close(log_fd)
            os.environ.update(env)
            os.environ[PARENT_ENV] = str(os.getppid())  # its lifeline: this server
            module = f"elasticdl_nb.runtime.{role}"
            sys.argv = [module, "--id", str(instance_id)]
            # What `ps` shows, and what finds a job's processes: the command it stands for.
            setproctitle.setproctitle(
                f"{sys.executable} -m {module} --id {instance_id} (forked; job {self.job_dir})"
            )
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exit_code(exc.code)
        except BaseException:  # noqa: BLE001 - the child's end: say why, in its log
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001, S110 - exiting anyway
                    pass
            os._exit(code)

    def _reap(self) -> None:
        for pid, returncode in reap(self.children):
            self.sock.sendall(encode({"op": "ended", "pid": pid, "returncode": returncode}))


def reap(children: set[int]) -> Iterator[tuple[int, int]]:
    """(pid, returncode) of each of `children` that ended, taken out of the set, without
    waiting (`Popen.returncode`'s convention: -N for killed by signal N)."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        yield pid, os.waitstatus_to_exitcode(status)


def exit_code(code: object) -> int:
    """`sys.exit(code)`'s status, as the interpreter would exit with it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
