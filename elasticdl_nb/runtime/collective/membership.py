"""Who is in the allreduce group, as the master keeps it: versions, joins, and the
agreement after a failure.

Explicit transitions, no I/O (the master's RPC handlers call in; unit tests drive it):

- `join(worker, address)`: a new worker waits for the next version; `propose()` makes
  it (old members in their ring order, then the joiners). Members switch to a newer
  version together, at a step boundary they agree on through the ring itself.
- `leave(worker)`: a retiring worker leaves at the next version, the same way.
- After a `PeerLost`, every survivor calls `report(...)` with the version it was in,
  the last step it completed and whether it still holds that step's reduced gradients.
  Once every member of that version that is still alive has reported (the dead are
  named by `dead(worker)` from instance events, or by not reporting before the
  master's deadline, `settle`), the master decides one `Recovery` for all of them:
  the new group (survivors, ring order kept), the step everyone must reach, and which
  survivor hands that step's result to those one step behind. Every survivor then
  applies the same update exactly once: nobody is rolled back, nobody applies twice.
- A failure while members switch to a version made by a join or leave finds some of
  them still in the old version and some in the new: reports are counted against the
  newest version of that chain (`episode`), so there is one decision for all of them,
  and every member of it that is alive must report (a joiner that never got the model
  does not, and is out at the deadline).
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticdl_nb.runtime.collective.ring import Group


@dataclass(frozen=True)
class Report:
    worker: int
    completed_step: int  # the last step whose update this worker applied
    holds_result: bool  # it still has that step's reduced gradients to hand on


@dataclass(frozen=True)
class Recovery:
    group: Group  # the survivors, as the next version
    step: int  # every survivor's last applied step once the recovery is done
    source: int | None  # the survivor that sends step `step`'s result (None: nobody behind)
    behind: tuple[int, ...]  # survivors that have not applied step `step` yet
    lost: tuple[int, ...]  # members of the old version that are out
    joiners: tuple[int, ...] = ()  # members of `group` that get the model from a survivor


class Membership:
    # What `replay` sets: a snapshot of it (runtime/master/snapshot.py) holds only that.
    _REPLAYED = ("groups", "version", "_dead", "_decided", "_switched")

    def __init__(self) -> None:
        self.groups: dict[int, Group] = {0: Group(0, ())}
        self.version = 0
        self._joining: dict[int, str] = {}
        self._leaving: set[int] = set()
        self._dead: set[int] = set()
        self._reports: dict[int, dict[int, Report]] = {}  # version -> worker -> report
        self._decided: dict[int, Recovery] = {}  # version -> what its survivors do
        self._switched: set[int] = set()  # versions made by a join or leave (propose)

    def snapshot_state(self) -> dict:
        return {name: getattr(self, name) for name in self._REPLAYED}

    def restore_state(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    @property
    def current(self) -> Group:
        return self.groups[self.version]

    @property
    def joining(self) -> int:
        """How many workers wait for the next version."""
        return len(self._joining)

    # ------------------------------------------------------------------ growth and shrink

    def join(self, worker: int, address: str) -> None:
        self._joining[worker] = address

    def leave(self, worker: int) -> None:
        self._leaving.add(worker)

    def propose(self) -> Group | None:
        """The next version if anyone joins or leaves (and no failure is being
        settled: a dead member, or survivors reporting), else None."""
        if not (self._joining or self._leaving) or self._reports:
            return None
        if any(w in self._dead for w, _ in self.current.members):
            return None  # the survivors' recovery makes the next version
        members = [m for m in self.current.members if m[0] not in self._leaving]
        members += sorted(self._joining.items())
        self._joining.clear()
        self._leaving.clear()
        group = self._new_version(members)
        self._switched.add(group.version)
        return group

    # ------------------------------------------------------------------ failure

    def dead(self, worker: int) -> None:
        """The backend reports `worker` ended: it will not report after a failure."""
        self._dead.add(worker)
        self._joining.pop(worker, None)

    def episode(self, version: int) -> int:
        """The version a failure in `version` is decided for: the newest one made from
        it by joins and leaves alone (members switch to those one by one)."""
        while version + 1 in self._switched:
            version += 1
        return version

    def report(self, version: int, report: Report) -> Recovery | None:
        """A survivor's account after PeerLost in group `version`: the Recovery once
        every live member has reported (and to anyone asking later), else None (ask
        again)."""
        version = self.episode(version)
        if version in self._decided:
            return self._decided[version]
        reports = self._reports.setdefault(version, {})
        reports[report.worker] = report
        if not self.missing(version):
            return self._decide(version)
        return None

    def missing(self, version: int) -> set[int]:
        """Members that are neither known dead nor have reported, after a failure in
        `version`."""
        version = self.episode(version)
        members = {w for w, _ in self.groups[version].members}
        return members - self._dead - set(self._reports.get(version, {}))

    def settle(self, version: int) -> Recovery | None:
        """Decide with the reports at hand: the master's deadline has passed, and whoever
        has not reported is out. None if nobody has reported."""
        version = self.episode(version)
        if version in self._decided:
            return self._decided[version]
        return self._decide(version) if self._reports.get(version) else None

    def _decide(self, version: int) -> Recovery:
        reports = self._reports.pop(version)
        old = self.groups[version].members
        survivors = [m for m in old if m[0] in reports and m[0] not in self._dead]
        step = max(reports[w].completed_step for w, _ in survivors)
        behind = tuple(w for w, _ in survivors if reports[w].completed_step < step)
        if any(reports[w].completed_step != step - 1 for w in behind):
            # A ring member cannot get more than one step ahead of its neighbours.
            raise AssertionError(f"survivors more than one step apart: {reports}")
        holders = [w for w, _ in survivors
                   if reports[w].completed_step == step and reports[w].holds_result]  # fmt: skip
        if behind and not holders:
            raise AssertionError(f"step {step} was applied but no survivor holds its result")
        # Workers waiting to join come along: they get the model from a survivor.
        joiners = sorted(self._joining.items())
        self._joining.clear()
        self._decided[version] = Recovery(
            group=self._new_version(survivors + joiners),
            step=step,
            source=holders[0] if behind else None,
            behind=behind,
            lost=tuple(w for w, _ in old if w not in {s for s, _ in survivors}),
            joiners=tuple(w for w, _ in joiners),
        )
        return self._decided[version]

    def restart(self) -> Group:
        """Every member of the newest version is lost: a new version with nobody in it,
        which the workers that join next form anew (from the replicas' checkpoint)."""
        self._dead.update(w for w, _ in self.current.members)
        self._leaving.clear()
        return self._new_version([])

    def replay(self, group: Group, failed: int | None, recovery: Recovery | None) -> None:
        """A version an earlier master made, as it journaled it: by a join or leave, or
        (`failed`: the version whose failure it decided) by `recovery`."""
        if not group.members:  # (a restart after every member was lost)
            self._dead.update(w for w, _ in self.current.members)
        self.groups[group.version] = group
        self.version = max(self.version, group.version)
        if not group.members:
            pass
        elif failed is None:
            self._switched.add(group.version)
        else:
            self._reports.pop(failed, None)
            self._decided[failed] = recovery
            self._dead.update(recovery.lost)

    def _new_version(self, members: list[tuple[int, str]]) -> Group:
        self.version += 1
        self.groups[self.version] = Group(self.version, tuple(members))
        return self.groups[self.version]
