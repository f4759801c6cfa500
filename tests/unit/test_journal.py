"""The event journal: numbered, resumable, followable, and kept on disk."""

import json
import threading
import time

from elasticdl_nb.runtime.master.journal import MORE, Journal, read_journal_file
from elasticdl_nb.vocabulary import EventKind


def test_events_are_numbered_and_resume_from_a_sequence_number(tmp_path):
    journal = Journal(tmp_path / "events.jsonl")
    for i in range(5):
        journal.append(EventKind.PROGRESS, step=i)
    assert [e.seq for e in journal.read(0, follow=False)] == [0, 1, 2, 3, 4]
    assert [e.data["step"] for e in journal.read(3, follow=False)] == [3, 4]


def test_an_event_may_carry_a_field_called_kind(tmp_path):
    journal = Journal()
    event = journal.append(EventKind.INSTANCE, kind="killed", role="worker")
    assert event.kind == "instance" and event.data["kind"] == "killed"


def test_a_follower_sees_new_events_and_stops_when_the_journal_closes():
    journal = Journal()
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(e.seq for e in journal.read(0)))
    reader.start()
    for i in range(3):
        journal.append(EventKind.PROGRESS, step=i)
    journal.close()
    reader.join(timeout=5)
    assert not reader.is_alive() and seen == [0, 1, 2]


def test_a_cancelled_follower_returns_without_new_events():
    journal = Journal()
    journal.append(EventKind.PROGRESS)
    assert [e.seq for e in journal.read(0, is_cancelled=lambda: True, poll=0.01)] == [0]


def test_the_file_replays_the_journal_and_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    for i in range(3):
        journal.append(EventKind.PROGRESS, step=i)
    journal.close()
    with open(path, "a") as f:
        f.write('{"seq": 3, "ti')  # a master killed mid-write
    assert [e.data["step"] for e in read_journal_file(path, from_seq=1)] == [1, 2]


def test_an_event_after_the_journal_closed_is_still_written_to_the_file(tmp_path):
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.append(EventKind.PROGRESS, step=0)
    journal.close()
    # (a late instance event: the master's end got out of order)
    journal.append(EventKind.PROGRESS, step=1)
    assert [e.data["step"] for e in read_journal_file(path)] == [0, 1]


def test_a_transaction_reaches_the_file_and_its_followers_in_one_piece(tmp_path):
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.append(EventKind.PROGRESS, step=0)
    seen: list[int] = []
    follower = threading.Thread(target=lambda: seen.extend(e.seq for e in journal.read(0)))
    follower.start()
    with journal.transaction():
        journal.append(EventKind.QUEUE, op="report", i=1)
        with journal.transaction():  # nested: part of the outer one
            journal.append(EventKind.QUEUE, op="finish", i=2)
        time.sleep(0.2)  # the follower waits meanwhile
        assert len(path.read_text().splitlines()) == 1
        assert seen in ([], [0])
    journal.append(EventKind.PROGRESS, step=3)
    journal.close()
    follower.join(5)
    assert seen == [0, 1, 2, 3]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get(MORE, False) for line in lines] == [False, True, False, False]


def test_a_transaction_cut_short_by_the_masters_death_is_cut_off_as_a_whole(tmp_path):
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    with journal.transaction():
        journal.append(EventKind.QUEUE, op="report", i=0)
        journal.append(EventKind.PROGRESS, step=1)
    journal.close()
    with open(path, "a") as f:  # the next one's first two lines made it, the third not
        f.write('{"seq":2,"time":1,"kind":"queue","data":{"op":"report"},"more":true}\n')
        f.write('{"seq":3,"time":1,"kind":"loss","data":{},"more":true}\n')
        f.write('{"seq":4,"time":1,"ki')
    successor = Journal(path)
    assert [e.kind for e in successor.continued] == ["queue", "progress"]
    successor.append(EventKind.MASTER_RESTARTED, incarnation=1)
    successor.close()
    assert [e.seq for e in read_journal_file(path)] == [0, 1, 2]
    assert json.loads(path.read_text().splitlines()[-1])["kind"] == "master_restarted"


class _Fenced(Exception):
    pass


def test_a_fenced_master_adds_nothing_not_even_a_transaction_it_began_in_time(tmp_path):
    """The fence is asked before every event and again before a transaction's events are
    written: a master that lost its right meanwhile writes none of them."""
    path = tmp_path / "events.jsonl"
    may_act = [True]

    def fence():
        if not may_act[0]:
            raise _Fenced()

    journal = Journal(path, fence=fence)
    journal.append(EventKind.PROGRESS, step=0)
    try:
        with journal.transaction():
            journal.append(EventKind.PROGRESS, step=1)
            may_act[0] = False  # (its lease lapsed while it worked)
    except _Fenced:
        pass
    else:
        raise AssertionError("a transaction ended after the fence closed was written")
    try:
        journal.append(EventKind.PROGRESS, step=2)
    except _Fenced:
        pass
    else:
        raise AssertionError("an event was taken after the fence closed")
    journal.close()
    assert [e.data["step"] for e in read_journal_file(path)] == [0]
