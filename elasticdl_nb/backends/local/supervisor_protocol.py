"""What a local job's supervisor and the master it runs say to each other: JSON lines
over a socketpair that the supervisor makes for each master it starts (the master finds
its end in the environment: `SUPERVISOR_FD_ENV`).

Master -> supervisor, each with a request number "req" the reply carries back:

    {"op": "launch", "role": "worker", "id": 3, "env": {...}}  reply {"pid": 4242}
    {"op": "kill", "role": "ps", "id": 0, "force": false}         reply {}
    {"op": "shutdown", "grace": 5.0}    (SIGTERM every worker and PS, SIGKILL after
                                         grace; the reply comes once all have ended)
    {"op": "adopt"}                     reply {"known": [["ps", 0], ["worker", 3]]}

Supervisor -> master: replies, {"op": "reply", "req": n, ...} ({"error": "..."} when
the request failed), and instance events, {"op": "event", <the fields of
`runtime.master.site.InstanceEvent`>}. A master hears events once it has sent its first
request; `adopt` first sends the current state of every instance the supervisor ever
started (a `started` event with the pid of one that runs, else how it ended), then its
reply. Events of one instance come in order: `started` before its end.

`env` (the worker and PS environment, with the job's token) travels here and never on a
command line or into a log. This module imports only the standard library: the
supervisor stays small (no gRPC, no TensorFlow).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from elasticdl_nb.runtime.lifeline import PARENT_ENV  # (standard library only, too)

SUPERVISOR_FD_ENV = "ELASTICDL_NB_SUPERVISOR_FD"  # the master's end of the socketpair
SUPERVISOR_PID_ENV = "ELASTICDL_NB_SUPERVISOR_PID"  # also read by runtime.master.serve
INCARNATION_ENV = "ELASTICDL_NB_MASTER_INCARNATION"  # 0 for the first master, then 1, 2...

# The fields of an instance event, as `runtime.master.site.InstanceEvent` names them.
EVENT_FIELDS = ("role", "instance_id", "kind", "exit_code", "signal", "reason", "pid")


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class LineReader:
    """Turns the bytes read from a stream into whole messages (a line may arrive in
    pieces, or several at once)."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]


def wake_on_signals(*signals: signal.Signals) -> tuple[socket.socket, socket.socket]:
    """A socketpair whose first end turns readable when a signal arrives, for a select
    loop to wake on (`drain` it then); `signals` get a handler that does nothing else.
    Keep both ends open while it serves. Main thread only."""
    wake_read, wake_write = socket.socketpair()
    for end in (wake_read, wake_write):
        end.setblocking(False)
    # A full buffer is fine: one byte wakes the loop.
    signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
    for sig in signals:
        signal.signal(sig, lambda *_: None)
    return wake_read, wake_write


def drain(sock: socket.socket) -> None:
    """Read whatever a non-blocking socket holds."""
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def start_talking_child(
    module: str, args: list[str], env: dict[str, str], log: Path, fd_env: str
) -> tuple[subprocess.Popen, socket.socket]:
    """`python -m module args` with its output on `log`, tied to this process (it dies
    with it: `runtime.lifeline`), and our end of a socketpair whose other end it finds in
    `fd_env`: how the supervisor starts each master and its fork server."""
    ours, theirs = socket.socketpair()
    env = {
        **env,
        fd_env: str(theirs.fileno()),
        PARENT_ENV: str(os.getpid()),
        # Neither forks with gRPC in use (the master forks nothing; the fork server forks
        # before any channel exists): gRPC's fork handlers are not wanted.
        "GRPC_ENABLE_FORK_SUPPORT": "false",
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            close_fds=True,
            pass_fds=(theirs.fileno(),),
        )
    theirs.close()
    return proc, ours
