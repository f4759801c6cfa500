"""A compacted journal (runtime/master/compaction.py, Journal.cut): what the history keeps
of the events a snapshot stands for, numbering that goes on across cuts, readers from any
seq (in the master, on the file, following across a cut), a new master that continues a
compacted journal, and a master that takes a job over from its snapshot and the tail."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master import compaction, recovery, snapshot
from elasticdl_nb.runtime.master.journal import Event, Journal, read_journal_file
from elasticdl_nb.runtime.master.recovery import take_over
from elasticdl_nb.vocabulary import EventKind
from elasticdl_nb.vocabulary.events import DROPPED_KINDS, THINNED_KINDS
from tests.unit.masters import RecordingLauncher, built_master
from tests.unit.test_master_rebuild import OPTIONS, a_job_with_some_history, report
from tests.unit.test_master_snapshot import LIVE, _continuing, assert_same, holdings


def _event(seq: int, kind: EventKind) -> Event:
    return Event(seq, float(seq), kind, {})


def test_the_history_keeps_every_kept_kind_a_thinned_sample_and_no_dropped_kind():
    events = []
    for i in range(10_000):  # a loss and a queue event every step, an epoch every 1,000
        events += [_event(len(events), EventKind.LOSS), _event(len(events) + 1, EventKind.QUEUE)]
        if i % 1000 == 0:
            events.append(_event(len(events), EventKind.EPOCH))
    history, thinned = compaction.kept(events, cap=100)
    assert [e.kind for e in history].count(EventKind.EPOCH) == 10
    assert not [e for e in history if e.kind in DROPPED_KINDS]
    losses = [e.seq for e in history if e.kind == EventKind.LOSS]
    assert thinned == {EventKind.LOSS: len(losses)} and 50 < len(losses) <= 100
    assert losses == sorted(losses) and history == sorted(history, key=lambda e: e.seq)
    # Spread over the whole run: the first and last losses stay, and the newest ones
    # are denser than the oldest.
    all_losses = [e.seq for e in events if e.kind == EventKind.LOSS]
    assert losses[0] == all_losses[0] and losses[-1] == all_losses[-1]
    gaps = [b - a for a, b in zip(losses, losses[1:])]
    assert gaps[-1] < gaps[0]
    # Thinning what was thinned keeps it within the cap (a job cut again and again).
    again, _ = compaction.kept(history + events[-50:], cap=100)
    assert sum(e.kind == EventKind.LOSS for e in again) <= 100
    assert THINNED_KINDS.isdisjoint(DROPPED_KINDS)


def _journal_with(path: Path, kinds: list[EventKind]) -> Journal:
    journal = Journal(path)
    for kind in kinds:
        journal.append(kind)
    return journal


def test_a_cut_moves_what_is_kept_to_the_history_and_numbering_goes_on(tmp_path):
    path = JobDir(tmp_path).events
    kinds = [EventKind.EPOCH, EventKind.QUEUE, EventKind.LOSS, EventKind.QUEUE] * 5
    journal = _journal_with(path, kinds)
    before = list(journal.read(0, follow=False))
    history, _ = compaction.kept([e for e in before if e.seq < 12])
    journal.cut(12, history, {"before": 12, "kept": len(history)})
    # Memory and events.jsonl hold the events from 12 on, and the cut's own event.
    assert journal.first == 12 and len(journal) == 21
    on_file = [e.seq for e in read_journal_file(path)]
    kept_before = [e.seq for e in before if e.seq < 12 and e.kind != EventKind.QUEUE]
    assert on_file == kept_before + list(range(12, 21))
    assert [e.seq for e in journal.read(0, follow=False)] == on_file
    assert [e.seq for e in journal.read(5, follow=False)] == [s for s in on_file if s >= 5]
    cut = list(journal.read(20, follow=False))[0]
    assert cut.kind == EventKind.JOURNAL_COMPACTED and cut.data["before"] == 12
    journal.append(EventKind.PHASE, phase="evaluating")
    journal.close()
    # A new master continues the compacted journal: the next seq, nothing lost.
    again = Journal(path)
    assert again.first == 12 and len(again) == 22
    assert [e.seq for e in again.continued] == list(range(12, 22))
    assert again.append(EventKind.EPOCH, epoch=3).seq == 22
    again.close()
    assert [e.seq for e in read_journal_file(path, 10)] == [10] + list(range(12, 23))


def test_a_follower_across_cuts_gets_every_event_once_in_order(tmp_path):
    journal = Journal(JobDir(tmp_path).events)
    seen: list[Event] = []
    follower = threading.Thread(target=lambda: seen.extend(journal.read(0, poll=0.05)))
    follower.start()
    for round_ in range(5):
        for _ in range(200):
            journal.append(EventKind.EPOCH, epoch=round_)
        before = len(journal) - 50
        kept = [e for e in journal.read(0, follow=False) if e.seq < before]
        journal.cut(before, kept, {"before": before})
    journal.close()
    follower.join(10)
    assert [e.seq for e in seen] == list(range(len(journal)))  # (EPOCH is kept whole)
    assert sum(e.kind == EventKind.JOURNAL_COMPACTED for e in seen) == 5


def test_a_master_takes_the_job_over_from_the_snapshot_of_a_compacted_journal(tmp_path):
    files = JobDir(tmp_path / "job")
    files.path.mkdir(parents=True)
    live = a_job_with_some_history(files.path, journal=Journal(files.events))
    everything = list(live.journal.read(0, follow=False))
    said = compaction.compact(live, files.master_snapshot)
    assert said["before"] == live.journal.first == len(everything) and said["dropped"] > 0
    # More happens after the cut: a task given, reported done.
    task = live.get_task(2, seq=1, wait_seconds=0)
    report(live, 2, task, 1, [task.range.start], done=True)
    everything += list(live.journal.read(len(everything), follow=False))
    live.journal.close()

    new = built_master(files.path, RecordingLauncher(), Journal(files.events), **OPTIONS)
    take_over(new, files, new.journal)
    assert new.rebuilt["snapshot"] == said["before"]
    assert new.rebuilt["replayed"] == len(everything) - said["before"]
    # It holds what a master that replayed the whole journal, uncompacted, holds.
    replayed = built_master(
        tmp_path / "replayed",
        RecordingLauncher(),
        _continuing(tmp_path / "replayed", [e.to_json() + "\n" for e in everything]),
        **OPTIONS,
    )
    recovery.rebuild(replayed, everything)
    assert_same(holdings(replayed, LIVE), holdings(new, LIVE))


def test_a_compacted_journal_without_its_snapshot_is_not_taken_over(tmp_path):
    files = JobDir(tmp_path)
    live = a_job_with_some_history(tmp_path, journal=Journal(files.events))
    compaction.compact(live, files.master_snapshot)
    live.journal.close()
    files.master_snapshot.unlink()
    new = built_master(tmp_path, RecordingLauncher(), Journal(files.events), **OPTIONS)
    with pytest.raises(RuntimeError, match="compacted before event .* cannot be taken over"):
        take_over(new, files, new.journal)


def test_a_master_killed_between_the_history_and_the_tail_leaves_a_readable_journal(tmp_path):
    # The cut writes the new history, then the new tail: killed in between, the old tail
    # (every event since the cut before) sits beside the new history. Readers and a new
    # master see every event once, in order.
    path = JobDir(tmp_path).events
    journal = _journal_with(path, [EventKind.EPOCH, EventKind.QUEUE] * 10)
    journal.cut(6, compaction.kept(list(journal.read(0, follow=False))[:6])[0], {"before": 6})
    journal.append(EventKind.PHASE, phase="evaluating")
    journal.close()
    old_tail = path.read_text()
    everything = [e.seq for e in read_journal_file(path)]
    # The next cut, at 14: its history is written, its tail is not.
    history = [e for e in read_journal_file(path) if e.seq < 14 and e.kind != EventKind.QUEUE]
    JobDir(tmp_path).events_history.write_text("".join(e.to_json() + "\n" for e in history))
    assert path.read_text() == old_tail
    assert [e.seq for e in read_journal_file(path)] == everything
    again = Journal(path)
    assert again.first == 6 and [e.seq for e in again.read(0, follow=False)] == everything
    again.close()


def test_a_snapshot_of_another_version_is_passed_over_while_the_journal_is_whole(tmp_path):
    import pickle

    files = JobDir(tmp_path)
    live = a_job_with_some_history(tmp_path, journal=Journal(files.events))
    _, blob = snapshot.take(live)
    old = pickle.loads(blob)
    old["version"] = "0.0.1"
    files.master_snapshot.write_bytes(pickle.dumps(old))  # (the journal was never cut)
    live.journal.close()
    new = built_master(tmp_path, RecordingLauncher(), Journal(files.events), **OPTIONS)
    take_over(new, files, new.journal)
    assert new.rebuilt["snapshot"] == 0 and new.rebuilt["replayed"] == len(new.journal)
