"""The one shape in which every backend reports what happened to an instance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

# What can happen to an instance, the same words for every backend.
STARTED = "started"  # launched (process spawned, pod created)
PENDING = "pending"  # waiting to be scheduled or started; `reason` says for what
RUNNING = "running"  # confirmed running
SUCCEEDED = "succeeded"  # exited with code 0
FAILED = "failed"  # exited with a non-zero code
KILLED = "killed"  # ended by a signal
PREEMPTED = "preempted"  # taken away by the platform; not the instance's fault
OOM = "oom"  # killed for exceeding its memory
DELETED = "deleted"  # removed without exiting on its own

ENDED = frozenset({SUCCEEDED, FAILED, KILLED, PREEMPTED, OOM, DELETED})


@dataclass(frozen=True)
class InstanceEvent:
    role: str  # "worker" | "ps"
    instance_id: int
    kind: str  # one of the constants above
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGKILL"
    reason: str = ""
    pid: int | None = None

    @property
    def ended(self) -> bool:
        return self.kind in ENDED

    def to_dict(self) -> dict[str, Any]:
        """The journal's shape: 'role', 'id', 'kind', and what else is known."""
        fields = {k: v for k, v in asdict(self).items() if v not in (None, "")}
        fields["id"] = fields.pop("instance_id")
        return fields


class InstanceLauncher(Protocol):
    """What the master needs from a backend to run its instances."""

    def launch(self, role: str, instance_id: int) -> None: ...

    def kill(self, role: str, instance_id: int, force: bool = False) -> None: ...

    def grow_memory(self, role: str) -> str | None:
        """Give the role's next instances more memory (after an OOM): 'OLD -> NEW', or
        None when there is no more to give."""
        ...

    def shutdown(self, grace_seconds: float) -> None: ...


EventSink = Callable[[InstanceEvent], None]
