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
from typing import Any

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
