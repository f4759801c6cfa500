"""The plugs the master needs from a backend, defined here so the runtime imports no
backend (backends implement them; `elasticdl_nb.backends` finds one by name):

- `MasterSite`: where the master stands: the address it listens on, the PS addresses
  when they are fixed before any PS starts, the launcher of its instances, and what to
  do with the job's final status besides writing it into the job directory.
- `Fence`: what keeps a master that another has replaced from acting on (one master acts
  for a job at a time): the journal asks it before every event it writes.
- `InstanceLauncher`: starts and kills workers and PS, and reports what happened to them
  as `InstanceEvent`s, in one shape and one vocabulary (`vocabulary.InstanceState`) for
  every backend. It holds no policy: that is `instances.InstanceManager`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import grpc

from elasticdl_nb.runtime.protocol.tls import JobTls
from elasticdl_nb.vocabulary import INSTANCE_ENDED, InstanceState


@dataclass(frozen=True)
class InstanceEvent:
    role: str  # vocabulary.Role: "worker" | "ps"
    instance_id: int
    kind: InstanceState
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGKILL"
    reason: str = ""
    pid: int | None = None

    @property
    def ended(self) -> bool:
        return self.kind in INSTANCE_ENDED

    def to_dict(self) -> dict[str, Any]:
        """The journal's shape: 'role', 'id', 'kind', and what else is known."""
        fields = {k: v for k, v in asdict(self).items() if v not in (None, "")}
        fields["id"] = fields.pop("instance_id")
        return fields


EventSink = Callable[[InstanceEvent], None]


class Fence(Protocol):
    """This master's right to act for its job, which it may lose to a successor (its
    node cut off, its process frozen, while the platform started another master)."""

    def check(self) -> None:
        """Return if this master may still act; else end the process at once, before
        it writes or launches anything (a fenced master leaves the job to its
        successor exactly as a killed one does)."""
        ...


class InstanceLauncher(Protocol):
    """What the master needs from a backend to run its instances."""

    def launch(self, role: str, instance_id: int, elastic: bool = False) -> None:
        """Start an instance; an `elastic` worker (above its range's MIN) runs at the
        backend's lowest priority, where it has priorities."""
        ...

    def kill(self, role: str, instance_id: int, force: bool = False) -> None: ...

    def grow_memory(self, role: str) -> str | None:
        """Give the role's next instances more memory (after an OOM): 'OLD -> NEW', or
        None when there is no more to give."""
        ...

    def shutdown(self, grace_seconds: float) -> None: ...

    def adopt(self) -> set[tuple[str, int]]:
        """On a master that replaces one that died: the (role, id) of every instance an
        earlier master of this job started that the backend still knows, whether it runs
        or ended while no master listened. Their current state is reported to the sink
        (as for any instance: started/running with the pid, or how it ended) before this
        returns; what ends later is reported as usual. Called once, before any launch."""
        ...


class MasterSite(Protocol):
    """Where a job's master stands; made by the job's backend in the master process."""

    @property
    def fence(self) -> Fence:
        """Asked before every journal event (see `Fence`); holds from `open` on."""
        ...

    @property
    def ps_addrs(self) -> list[str]:
        """The PS addresses when they are fixed before any PS starts (a Service per PS),
        else empty: each PS then reports the port it bound."""
        ...

    def open(self) -> None:
        """Learn where the master stands (its address, the PS addresses): may ask the
        cluster, and fail; the job then fails with the reason."""
        ...

    def bind(self, server: grpc.Server, tls: JobTls | None) -> str:
        """Make `server` listen (serving TLS with `tls`, `channels.listen`); returns the
        address the master is reached at."""
        ...

    def launcher(self, env: dict[str, str], on_event: EventSink) -> InstanceLauncher:
        """The launcher of the job's instances, which get `env` (the process environment)
        and report to `on_event`."""
        ...

    def job_ended(self, status: dict[str, Any]) -> None:
        """The job is over (or its master cannot start) with this final status: tell
        whoever watches the backend rather than the job directory."""
        ...
