"""The master's side of the allreduce group, for its RPC handlers: each call blocks here
(in the handler's own thread) until it has its answer.

- `join`: a worker enters with its ring address and waits until a group version holds
  it. The first version forms once the expected workers are all in (or `form_seconds`
  after the first, with whoever came); later joiners make the next version at once.
  (Who sends a new member the model is decided by the members themselves when they
  switch: the first member of the new version that was in their old one.)
- `latest`: the newest version; members pass it on through the ring (news) and switch
  together at a step boundary.
- `report_lost`: after a PeerLost, a survivor's account; returns the one `Recovery` when
  all live members have reported, or when `settle_seconds` have passed since the first
  report (a member that neither reports nor is known dead is then out). A member that
  hangs is named by its successor, whose step deadline ran out waiting for it (the
  `suspect`): once only suspects are missing, the decision waits `suspect_seconds` for
  them, not `settle_seconds` (an innocent suspect, itself blocked behind the hung one,
  reports within that time).
- `dead`: the backend saw a worker end; an agreement may be complete without it.

Every change is journaled ("group" events: version, members and their addresses, who
joined and left, and after a failure the whole decision), so that a new master that
replaces one that died holds the same versions and answers a survivor that asks again
with the same decision (`replay`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from elasticdl_nb.runtime.collective.membership import Membership, Recovery, Report
from elasticdl_nb.runtime.collective.ring import Group, PeerLost
from elasticdl_nb.vocabulary import EventKind, GroupChange


class GroupCoordinator:
    def __init__(
        self,
        expected: int,
        journal: Callable[..., None] = lambda kind, **data: None,
        form_seconds: float = 60.0,
        settle_seconds: float = 10.0,
        suspect_seconds: float = 1.0,
    ):
        self.expected = expected
        self.form_seconds, self.settle_seconds = form_seconds, settle_seconds
        self.suspect_seconds = suspect_seconds
        self._suspects: dict[int, set[int]] = {}  # version -> members named as hung
        self._causes: dict[int, dict[int, str]] = {}  # version -> reporter -> what it saw
        self._journal = journal
        self._membership = Membership()
        self._changed = threading.Condition()
        self._first_join: float | None = None
        self._first_report: dict[int, float] = {}  # version -> when its failure was reported
        self._journaled: set[int] = set()  # versions made after a failure, journaled once
        # Versions formed from nothing -> the replicas' checkpoint they start from ("":
        # none); the next group formed starts from `_restore` (set when all were lost).
        self.formed: dict[int, str] = {}
        self._restore = ""

    def held(self) -> threading.Condition:
        """Its lock: held, the group changes not (a master's snapshot holds it)."""
        return self._changed

    def snapshot_state(self) -> dict:
        """What `replay` sets (a master's snapshot: runtime/master/snapshot.py)."""
        with self._changed:
            return {
                "membership": self._membership.snapshot_state(),
                "journaled": set(self._journaled),
                "formed": dict(self.formed),
                "restore": self._restore,
                "formed_once": self._first_join is not None,
            }

    def restore_state(self, state: dict) -> None:
        with self._changed:
            self._membership.restore_state(state["membership"])
            self._journaled, self.formed = state["journaled"], state["formed"]
            self._restore = state["restore"]
            self._first_join = time.monotonic() if state["formed_once"] else None

    # ------------------------------------------------------------------ joining

    def join(self, worker: int, address: str, timeout: float) -> Group:
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
        forming = not m.current.members  # the first group, or the one after all were lost
        if forming:
            waited = time.monotonic() - (self._first_join or time.monotonic())
            if m.joining < self.expected and waited < self.form_seconds:
                return
        old = {w for w, _ in m.current.members}
        group = m.propose()
        if group is None:
            return
        members = [w for w, _ in group.members]
        joined = [w for w in members if w not in old]
        reason = (
            GroupChange.FORMED if forming else GroupChange.JOINED if joined else GroupChange.LEFT
        )
        restore = {}
        if forming:
            self.formed[group.version], self._restore = self._restore, ""
            restore = {"restore": self.formed[group.version]}
        self._journal(
            EventKind.GROUP, version=group.version, members=members, joined=joined,
            left=sorted(old - set(members)), reason=reason,
            addresses=[a for _, a in group.members], **restore,
        )  # fmt: skip
        self._changed.notify_all()

    def _admission(self, worker: int) -> Group | None:
        """The version `worker` was admitted to (the first that holds it), if any."""
        m = self._membership
        for version in range(1, m.version + 1):
            if worker in {w for w, _ in m.groups[version].members}:
                return m.groups[version]
        return None

    # ------------------------------------------------------------------ reading

    def latest(self) -> int:
        with self._changed:
            return self._membership.version

    def group(self, version: int = 0) -> Group:
        """A version's group (0: the newest)."""
        with self._changed:
            return self._membership.groups[version or self._membership.version]

    def members(self) -> set[int]:
        """The workers of the newest version."""
        with self._changed:
            return {w for w, _ in self._membership.current.members}

    # ------------------------------------------------------------------ a new master

    def replay(self, data: dict) -> None:
        """A `group` event an earlier master journaled: that version (and, after a
        failure, the decision, which survivors that ask again get as the others did)."""
        group = Group(data["version"], tuple(zip(data["members"], data["addresses"])))
        recovery = None
        if data["reason"] == GroupChange.FAILURE:
            recovery = Recovery(
                group, data["step"], data["source"], tuple(data["behind"]),
                tuple(data["left"]), tuple(data["joiners"]),
            )  # fmt: skip
        with self._changed:
            self._membership.replay(group, data.get("failed"), recovery)
            self._journaled.add(group.version)
            self._first_join = self._first_join or time.monotonic()
            if data["reason"] == GroupChange.RESTORED:
                self._restore = data["restore"]
            elif "restore" in data:  # formed from nothing
                self.formed[group.version], self._restore = data["restore"], ""

    # ------------------------------------------------------------------ failure

    def restart(self, checkpoint: str, step: int) -> None:
        """Every member is lost: the next group forms anew and starts from `checkpoint`
        (the replicas' checkpoint of `step`)."""
        with self._changed:
            lost = sorted(self.members())
            group = self._membership.restart()
            self._restore, self._first_join = checkpoint, None
            self.expected = max(1, len(lost))  # their replacements form the next group
            self._journal(
                EventKind.GROUP, version=group.version, members=[], joined=[], left=lost,
                reason=GroupChange.RESTORED, addresses=[], restore=checkpoint, step=step,
            )  # fmt: skip
            self._maybe_grow()  # (joiners may be waiting already)
            self._changed.notify_all()

    def dead(self, worker: int) -> None:
        with self._changed:
            self._membership.dead(worker)
            self._changed.notify_all()

    def leave(self, worker: int) -> None:
        """A retiring worker leaves at the next version."""
        with self._changed:
            self._membership.leave(worker)
            self._maybe_grow()

    def report_lost(
        self,
        version: int,
        report: Report,
        timeout: float,
        suspect: int | None = None,
        cause: str = "",
    ) -> Recovery:
        deadline = time.monotonic() + timeout
        with self._changed:
            version = self._membership.episode(version)
            first = self._first_report.setdefault(version, time.monotonic())
            if suspect is not None:
                self._suspects.setdefault(version, set()).add(suspect)
            self._causes.setdefault(version, {})[report.worker] = cause
            recovery = self._membership.report(version, report)
            while recovery is None:
                waited = time.monotonic() - first
                only_suspects = self._membership.missing(version) <= self._suspects.get(
                    version, set()
                )
                if waited >= (self.suspect_seconds if only_suspects else self.settle_seconds):
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
                    EventKind.GROUP, version=recovery.group.version,
                    members=[w for w, _ in recovery.group.members], joined=[],
                    left=list(recovery.lost), reason=GroupChange.FAILURE,
                    step=recovery.step, agreed_s=round(time.monotonic() - first, 6),
                    causes={str(w): c for w, c in self._causes.get(version, {}).items()},
                    addresses=[a for _, a in recovery.group.members], failed=version,
                    source=recovery.source, behind=list(recovery.behind),
                    joiners=list(recovery.joiners),
                )  # fmt: skip
            self._changed.notify_all()
            return recovery
