"""A master's state at one point of its journal, for a master that takes the job over to
start from instead of replaying every event since the job began (issue 39).

Rebuilding from the journal (`recovery.py`) hands each event to the part of the master
that wrote it, and each part's `replay` sets its state. A snapshot is the same state
taken whole: `take` asks every part (`parts`) for it, `restore` gives it back to the
parts of a new master, and the journal's events from the snapshot's `seq` on are then
replayed as before. So `restore(take(m))` followed by the events after it leaves a master
exactly as replaying everything would (tests/unit/test_master_snapshot.py checks that,
attribute by attribute, on recorded journals).

A part names its state in `STATE`: the attributes its replay sets. One whose state needs
more than copying (a time on this process's monotonic clock, a flag of work under way
that a new master must do again) says so itself with `snapshot_state()` and
`restore_state(state)`.

The snapshot is pickled: only a master of the same job reads it, running the same code,
and it holds the parts' own objects (tasks, instances, evaluation rounds). It says which
version of elasticdl-nb wrote it and the layout of the state it holds (each part's class
and STATE); another version's or layout's is refused (`SnapshotMismatch`), and the
caller replays the journal instead.
"""

from __future__ import annotations

import pickle
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elasticdl_nb.runtime.master.job_master import JobMaster


class SnapshotMismatch(ValueError):
    """A snapshot this master cannot start from (another version wrote it)."""


def parts(master: JobMaster) -> dict[str, Any]:
    """The parts of `master` whose state rebuilding from the journal sets, by name."""
    found = {
        "job": master,
        "queue": master.queue,
        "desk": master.desk,
        "phases": master.phases,
        "progress": master.progress,
        "decisions": master.decisions,
        "evaluations": master.evaluations,
        "instances": master.instances,
        "strategy": master.strategy,
        "goodput": master.goodput,
        "stragglers": master.stragglers,
    }
    if master.growth is not None:
        found["growth"] = master.growth
    return found


def _version() -> str:
    try:
        return metadata.version("elasticdl-nb")
    except metadata.PackageNotFoundError:  # (run from a source tree)
        return "unknown"


def _layout(found: dict[str, Any]) -> dict[str, tuple]:
    """What the state of each part is made of: its class and the names in its STATE."""
    return {
        name: (type(part).__qualname__, tuple(getattr(part, "STATE", ())))
        for name, part in found.items()
    }


def take(master: JobMaster) -> tuple[int, bytes]:
    """The master's state now and the journal's length it stands for: (seq, snapshot).
    Under the job's lock, outside any journal transaction, so the state is exactly the
    fold of the events before `seq`."""
    # The strategy's own lock (the allreduce group's) is taken after the job's and before
    # the journal's, the order its threads take them in; the journal's, as a transaction,
    # holds back events from any other thread until the snapshot is pickled.
    with master.lock, master.strategy.held_still(), master.journal.transaction():
        master.goodput.catch_up()
        master.stragglers.catch_up()
        seq = len(master.journal)
        found = parts(master)
        state = {name: _state_of(part) for name, part in found.items()}
        snapshot = {"version": _version(), "layout": _layout(found), "seq": seq, "parts": state}
        blob = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
    return seq, blob


def restore(master: JobMaster, blob: bytes) -> int:
    """Set `master` (new, nothing started) to the snapshot's state; returns the seq of
    the first event after it, from which the journal is replayed."""
    snapshot = pickle.loads(blob)
    if snapshot.get("version") != _version():
        raise SnapshotMismatch(
            f"the snapshot was written by elasticdl-nb {snapshot.get('version')}, this "
            f"master is {_version()}"
        )
    found = parts(master)
    if snapshot.get("layout") != _layout(found):
        raise SnapshotMismatch(
            f"the snapshot holds {snapshot.get('layout')}, this master's state is {_layout(found)}"
        )
    with master.lock:
        for name, part in found.items():
            _restore(part, snapshot["parts"][name])
    return snapshot["seq"]


def _state_of(part: Any) -> dict:
    own = getattr(part, "snapshot_state", None)
    return own() if own is not None else {name: getattr(part, name) for name in part.STATE}


def _restore(part: Any, state: dict) -> None:
    own = getattr(part, "restore_state", None)
    if own is not None:
        own(state)
        return
    for name, value in state.items():
        setattr(part, name, value)
