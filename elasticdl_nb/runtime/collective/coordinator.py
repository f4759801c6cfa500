"""The master's side of the allreduce group, for its RPC handlers: each call blocks here
(in the handler's own thread) until it has its answer.

- `join`: a worker enters with its ring address and waits until a group version holds
  it. The first version forms once the expected workers are all in (or `form_seconds`
  after the first, with whoever came); later joiners make the next version at once, and
  learn which member will send them the model and optimizer state (`state_from`).
- `latest`: the newest version; members pass it on through the ring (news) and switch
  together at a step boundary.
- `report_lost`: after a PeerLost, a survivor's account; returns the one `Recovery` when
  all live members have reported, or when `settle_seconds` have passed since the first
  report (a member that neither reports nor is known dead is then out).
- `dead`: the backend saw a worker end; an agreement may be complete without it.

Every change is journaled ("group" events: version, members, who joined and left).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elasticdl_nb.runtime.collective.membership import Membership, Recovery, Report
from elasticdl_nb.runtime.collective.ring import Group, PeerLost


@dataclass(frozen=True)
class Admission:
    group: Group
    state_from: int | None  # the member that sends this joiner the state (None: first group)


class GroupCoordinator:
    def __init__(
        self,
        expected: int,
        journal: Callable[..., None] = lambda kind, **data: None,
        form_seconds: float = 60.0,
        settle_seconds: float = 10.0,
    ):
        self.expected = expected
        self.form_seconds, self.settle_seconds = form_seconds, settle_seconds
        self._journal = journal
        self._membership = Membership()
        self._changed = threading.Condition()
        self._first_join: float | None = None
        self._first_report: dict[int, float] = {}  # version -> when its failure was reported
        self._state_from: dict[int, int] = {}  # version -> the member that sends joiners state
        self._journaled: set[int] = set()  # versions made after a failure, journaled once

    # ------------------------------------------------------------------ joining

    def join(self, worker: int, address: str, timeout: float) -> Admission:
        deadline = time.monotonic() + timeout
        with self._changed:
            self._membership.join(worker, address)
            self._first_join = self._first_join or time.monotonic()
            self._maybe_grow()
            while (admitted := self._admission(worker)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerLost(None, f"worker {worker} was not admitted within {timeout:g} s")
                self._changed.wait(min(left, 0.5))
                self._maybe_grow()
            return admitted

    def _maybe_grow(self) -> None:
        m = self._membership
        forming = m.version == 0
        if forming:
            waited = time.monotonic() - (self._first_join or time.monotonic())
            if m.joining < self.expected and waited < self.form_seconds:
                return
        old = {w for w, _ in m.current.members}
        group = m.propose()
        if group is None:
            return
        stays = [w for w, _ in group.members if w in old]
        if stays:
            self._state_from[group.version] = stays[0]
        members = [w for w, _ in group.members]
        self._journal(
            "group", version=group.version, members=members,
            joined=[w for w in members if w not in old],
            left=sorted(old - set(members)), reason="formed" if forming else "joined",
        )  # fmt: skip
        self._changed.notify_all()

    def _admission(self, worker: int) -> Admission | None:
        m = self._membership
        for version in range(m.version, 0, -1):
            group = m.groups[version]
            if worker in {w for w, _ in group.members}:
                return Admission(group, self._state_from.get(version))
        return None

    # ------------------------------------------------------------------ reading

    def latest(self) -> int:
        with self._changed:
            return self._membership.version

    def group(self, version: int) -> tuple[Group, int | None]:
        """A version's group, and the member that sends its joiners the state."""
        with self._changed:
            return self._membership.groups[version], self._state_from.get(version)

    # ------------------------------------------------------------------ failure

    def dead(self, worker: int) -> None:
        with self._changed:
            self._membership.dead(worker)
            self._changed.notify_all()

    def leave(self, worker: int) -> None:
        """A retiring worker leaves at the next version."""
        with self._changed:
            self._membership.leave(worker)
            self._maybe_grow()

    def report_lost(self, version: int, report: Report, timeout: float) -> Recovery:
        deadline = time.monotonic() + timeout
        with self._changed:
            first = self._first_report.setdefault(version, time.monotonic())
            recovery = self._membership.report(version, report)
            while recovery is None:
                if time.monotonic() - first >= self.settle_seconds:
                    recovery = self._membership.settle(version)
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerLost(None, f"no agreement on group {version} within {timeout:g} s")
                self._changed.wait(min(left, 0.2))
                recovery = self._membership.report(version, report)
            if recovery.group.version not in self._journaled:  # each decision once
                self._journaled.add(recovery.group.version)
                self._journal(
                    "group", version=recovery.group.version,
                    members=[w for w, _ in recovery.group.members], joined=[],
                    left=list(recovery.lost), reason="failure",
                    step=recovery.step, agreed_s=round(time.monotonic() - first, 6),
                )  # fmt: skip
            self._changed.notify_all()
            return recovery
