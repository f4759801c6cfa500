"""A master's snapshot (runtime/master/snapshot.py) stands for the journal before it: a new
master restored from it, with the events after it replayed, holds what one that replayed
the whole journal holds, attribute by attribute over every part the rebuild sets (so an
attribute a part forgot to name in its STATE shows here), for snapshots taken by a live
master and at many points of the recorded journals (tests/journals/)."""

from __future__ import annotations

import json
import pickle
import threading
from collections import deque
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import Message

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master import recovery, snapshot
from elasticdl_nb.runtime.master.assembly import build_master
from elasticdl_nb.runtime.master.callbacks import CALLBACKS_FILE
from elasticdl_nb.runtime.master.journal import Event, Journal
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary.events import MORE
from tests.unit.masters import RecordingLauncher, built_master
from tests.unit.test_master_rebuild import OPTIONS, a_job_with_some_history, report

JOURNALS = Path(__file__).parent.parent / "journals"
RECORDED = sorted(p.name for p in JOURNALS.iterdir() if (p / "events.jsonl").exists())

# What two masters rebuilt apart may hold differently, and why that is no loss.
NOT_COMPARED = {
    # where each test master's directory is, and what its own rebuild took
    ("job", "job_dir"),
    ("job", "name"),
    ("job", "export_path"),
    ("job", "saved_model_path"),
    ("job", "rebuilt"),
    ("queue", "_wholes"),  # a cache of what the sources say, filled as it is asked
    ("strategy", "_deferred"),  # when each dead member died: this process's clock
    ("strategy", "coordinator"),  # (compared through its snapshot_state)
    ("goodput", "_journal"),
    ("stragglers", "_journal"),
}


def plain(value, seen=frozenset()):
    """`value` as nested plain values, for ==: objects by their attributes, locks,
    threads, executors and functions left out (wiring, not state)."""
    if isinstance(value, str | int | float | bool | type(None)):
        return value
    if isinstance(value, np.ndarray | np.generic):
        return ("array", np.asarray(value).tolist())
    if isinstance(value, Message):
        return (type(value).__name__, value.SerializeToString(deterministic=True))
    if isinstance(value, dict):
        return {repr(k): plain(v, seen) for k, v in value.items()}
    if isinstance(value, list | tuple | deque):
        return [plain(v, seen) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(repr(plain(v, seen)) for v in value)
    if callable(value) or isinstance(
        value, Executor | threading.Thread | type(threading.Lock()) | threading.Condition
    ):
        return "<wiring>"
    if isinstance(value, threading.Event):
        return ("event", value.is_set())
    if id(value) in seen or not hasattr(value, "__dict__"):
        return "<wiring>"
    if type(value).__module__.startswith("elasticdl_nb.runtime.master.journal"):
        return "<wiring>"
    seen = seen | {id(value)}
    return (type(value).__name__, {k: plain(v, seen) for k, v in sorted(vars(value).items())})


def holdings(master, not_compared=frozenset()) -> dict:
    """Every attribute of every part the rebuild sets, as plain values (the parts' links
    to each other and to the master left out), the journal's folds brought up to date;
    but those `NOT_COMPARED` and `not_compared`."""
    master.goodput.catch_up()
    master.stragglers.catch_up()
    parts = snapshot.parts(master)
    others = {id(p) for p in parts.values()} | {id(master)}
    out = {}
    for name, part in parts.items():
        for attr, value in vars(part).items():
            if (name, attr) in NOT_COMPARED | not_compared or id(value) in others:
                continue
            out[f"{name}.{attr}"] = plain(value, frozenset(others))
    group = getattr(master.strategy, "coordinator", None)
    if group is not None:
        out["strategy.coordinator"] = plain(
            {k: v for k, v in group.snapshot_state().items() if k != "formed_once"}
        )
    return out


def assert_same(a: dict, b: dict) -> None:
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    assert not differ, "\n".join(f"{k}:\n  {a.get(k)!r}\n  {b.get(k)!r}" for k in differ[:5])


# ---------------------------------------------------------------------- a live master


# The live masters here never ran their coordinator, which journals the job's start:
# each one rebuilt without a snapshot has its own `started`.
LIVE = frozenset({("job", "started")})


def _continuing(job_dir: Path, lines: list[str]) -> Journal:
    """The journal a new master opens on the job directory, `lines` on it."""
    path = JobDir(job_dir).events
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return Journal(path)


def _fresh(tmp_path, name: str, events: list[Event]):
    """A new master of the live job, its journal continuing `events`, rebuilt nothing."""
    journal = _continuing(tmp_path / name, [e.to_json() + "\n" for e in events])
    return built_master(tmp_path / name, RecordingLauncher(), journal, **OPTIONS)


def test_a_live_master_s_snapshot_restores_what_replaying_its_journal_rebuilds(tmp_path):
    live = a_job_with_some_history(tmp_path / "live")
    seq, blob = snapshot.take(live)
    assert seq == len(live.journal)
    events = list(live.journal.read(0, follow=False))

    replayed = _fresh(tmp_path, "replayed", events)
    restored = _fresh(tmp_path, "restored", events)
    recovery.rebuild(replayed, events)
    recovery.rebuild(restored, events, snapshot=blob)
    assert_same(holdings(replayed, LIVE), holdings(restored, LIVE))
    assert restored.rebuilt["replayed"] == 0 and restored.rebuilt["snapshot"] == seq
    assert restored.rebuilt["continued"] == replayed.rebuilt["continued"] == len(events)


def test_events_after_the_snapshot_are_replayed_on_top_of_it(tmp_path):
    live = a_job_with_some_history(tmp_path / "live")
    seq, blob = snapshot.take(live)
    # More happens after the snapshot: a task given, reported done, another given.
    given = live.get_task(2, seq=1, wait_seconds=0)
    report(live, 2, given, 1, [], done=True, states={"acc": [[1.0, 2.0]]})
    live.get_task(3, seq=1, wait_seconds=0)
    events = list(live.journal.read(0, follow=False))
    assert len(events) > seq

    replayed = _fresh(tmp_path, "replayed", events)
    restored = _fresh(tmp_path, "restored", events)
    recovery.rebuild(replayed, events)
    recovery.rebuild(restored, events, snapshot=blob)
    assert_same(holdings(replayed, LIVE), holdings(restored, LIVE))
    assert restored.rebuilt["replayed"] == len(events) - seq


def test_a_snapshot_of_another_version_is_refused(tmp_path, monkeypatch):
    _, blob = snapshot.take(a_job_with_some_history(tmp_path / "live"))
    old = pickle.loads(blob)
    old["version"] = "0.0.1"
    with pytest.raises(snapshot.SnapshotMismatch, match="0.0.1"):
        snapshot.restore(_fresh(tmp_path, "new", []), pickle.dumps(old))


# ------------------------------------------------------------------ recorded journals


def _recorded_master(folder: Path, job_dir: Path, lines: list[str]):
    """A new master for the recorded job's spec, its journal continuing `lines`, its
    data the sizes the recording had (the digits split: 1,400 training records, 397
    validation)."""
    spec = JobSpec.from_json((folder / "spec.json").read_text())
    bundle = JobDir(job_dir).bundle
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / CALLBACKS_FILE).write_text("[]")
    validation = [SourceInfo("validation", "npy", 397)] if spec.validation_data else []
    return build_master(
        spec,
        job_dir,
        _continuing(job_dir, lines),
        token="t",
        train=[SourceInfo("train", "npy", 1400)],
        validation=validation,
        launcher_for=lambda on_event: RecordingLauncher(),
    )


def _recorded(folder: Path) -> tuple[list[str], list[int]]:
    """The journal's lines and the seqs a snapshot may stand for: after a whole
    transaction (not after a line marked `more`)."""
    lines = (folder / "events.jsonl").read_text().splitlines(keepends=True)
    cuts = [i + 1 for i, line in enumerate(lines) if not json.loads(line).get(MORE)]
    return lines, cuts


@pytest.mark.parametrize("name", RECORDED)
def test_snapshots_anywhere_in_a_recorded_journal_stand_for_the_events_before_them(tmp_path, name):
    lines, cuts = _recorded(JOURNALS / name)
    folder = JOURNALS / name
    whole = _recorded_master(folder, tmp_path / "whole", lines)
    recovery.rebuild(whole, whole.journal.continued)
    expected = holdings(whole)
    # Ten cuts spread over the journal, the first and last included.
    for cut in sorted({cuts[i * (len(cuts) - 1) // 9] for i in range(10)}):
        before = _recorded_master(folder, tmp_path / f"before-{cut}", lines[:cut])
        recovery.rebuild(before, before.journal.continued)
        at, blob = snapshot.take(before)
        assert at == cut
        after = _recorded_master(folder, tmp_path / f"after-{cut}", lines)
        recovery.rebuild(after, after.journal.continued, snapshot=blob)
        assert_same(expected, holdings(after))


def test_a_snapshot_of_another_state_layout_is_refused(tmp_path):
    # (code that changed a part's STATE, at the same version number)
    _, blob = snapshot.take(a_job_with_some_history(tmp_path / "live"))
    old = pickle.loads(blob)
    old["layout"]["queue"] = ("TaskQueue", ("todo", "doing"))
    with pytest.raises(snapshot.SnapshotMismatch, match="this master's state is"):
        snapshot.restore(_fresh(tmp_path, "new", []), pickle.dumps(old))
