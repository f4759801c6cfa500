"""The master's group coordinator with its callers as real threads (as the RPC handlers
are): the first group forms when the expected workers are in; a late joiner gets the next
version; survivors of a failure all get the same decision, without waiting for a member
the backend saw die, at the settle deadline without one that went silent, and sooner
without one its successor names as hung; every change is journaled."""

from __future__ import annotations

import threading
import time

from elasticdl_nb.runtime.collective.coordinator import GroupCoordinator
from elasticdl_nb.runtime.collective.membership import Report


class Journal:
    def __init__(self):
        self.events = []

    def __call__(self, kind, **data):
        self.events.append((kind, data))


def in_threads(calls: dict) -> dict:
    results = {}

    def run(key, call):
        results[key] = call()

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def formed(size: int, journal=None) -> GroupCoordinator:
    coordinator = GroupCoordinator(size, journal or Journal(), settle_seconds=0.5)
    in_threads({w: (lambda w=w: coordinator.join(w, f"h:{w}", 10)) for w in range(size)})
    return coordinator


def test_the_first_group_forms_with_everyone_and_a_late_joiner_gets_the_next_version():
    journal = Journal()
    coordinator = GroupCoordinator(3, journal)
    admitted = in_threads({w: (lambda w=w: coordinator.join(w, f"h:{w}", 10)) for w in range(3)})
    assert {a.version for a in admitted.values()} == {1}
    assert [w for w, _ in admitted[0].members] == [0, 1, 2]

    late = coordinator.join(7, "h:7", 10)
    assert late.version == 2 and [w for w, _ in late.members] == [0, 1, 2, 7]
    assert coordinator.latest() == 2
    assert [(e["version"], e["joined"], e["reason"]) for _, e in journal.events] == [
        (1, [0, 1, 2], "formed"),
        (2, [7], "joined"),
    ]


def test_the_first_group_forms_without_a_worker_that_never_comes():
    coordinator = GroupCoordinator(3, form_seconds=0.3)
    started = time.monotonic()
    admitted = in_threads({w: (lambda w=w: coordinator.join(w, f"h:{w}", 10)) for w in (0, 1)})
    assert time.monotonic() - started < 5
    assert [w for w, _ in admitted[0].members] == [0, 1]


def test_survivors_get_one_decision_without_waiting_for_the_dead():
    journal = Journal()
    coordinator = formed(4, journal)
    coordinator.dead(2)
    reports = {
        0: Report(0, 10, True),
        1: Report(1, 10, True),
        3: Report(3, 11, True),
    }
    started = time.monotonic()
    decided = in_threads(
        {w: (lambda r=r: coordinator.report_lost(1, r, timeout=10)) for w, r in reports.items()}
    )
    assert time.monotonic() - started < 0.5  # everyone alive reported: no settle wait
    assert len({id(d) for d in decided.values()}) == 1  # the very same decision
    recovery = decided[0]
    assert (recovery.step, recovery.source, recovery.behind) == (11, 3, (0, 1))
    kind, event = journal.events[-1]
    assert (kind, event["reason"], event["left"], event["members"]) == (
        "group",
        "failure",
        [2],
        [0, 1, 3],
    )
    assert event["agreed_s"] < 0.5


def test_a_silent_member_is_out_at_the_settle_deadline():
    coordinator = formed(3)  # settle_seconds=0.5; worker 1 hangs, nobody saw it die
    started = time.monotonic()
    decided = in_threads(
        {w: (lambda w=w: coordinator.report_lost(1, Report(w, 4, True), 10)) for w in (0, 2)}
    )
    waited = time.monotonic() - started
    assert 0.4 < waited < 3
    assert decided[0] is decided[2] and decided[0].lost == (1,)


def test_a_member_its_successor_names_as_hung_is_out_after_the_short_suspect_wait():
    coordinator = formed(4)
    coordinator.settle_seconds, coordinator.suspect_seconds = 30, 0.3
    # Ring 0 -> 1 -> 2 -> 3: worker 1 hangs; 2 waited for it past its deadline, and so
    # did 3 for 2 (blocked behind it): both name their predecessor. 2 reports late.
    calls = {
        0: lambda: coordinator.report_lost(1, Report(0, 4, True), 10, cause="closed"),
        2: lambda: (time.sleep(0.1), coordinator.report_lost(1, Report(2, 4, True), 10, 1))[1],
        3: lambda: coordinator.report_lost(1, Report(3, 4, True), 10, suspect=2),
    }
    started = time.monotonic()
    decided = in_threads(calls)
    assert time.monotonic() - started < 5  # not the 30 s settle deadline
    assert decided[0] is decided[2] is decided[3]
    assert decided[0].lost == (1,)  # the innocent suspect reported, and stays


def test_after_every_member_is_lost_the_replacements_form_a_group_that_starts_from_the_checkpoint():
    journal = Journal()
    coordinator = formed(3, journal)
    for w in range(3):
        coordinator.dead(w)
    coordinator.restart("checkpoints/replicas-000000000040.json", step=40)
    assert coordinator.members() == set()
    joined = in_threads({w: (lambda w=w: coordinator.join(w, f"h:{w}", 10)) for w in (3, 4, 5)})
    group = joined[3]
    assert {w for w, _ in group.members} == {3, 4, 5} and all(g == group for g in joined.values())
    assert coordinator.formed[group.version] == "checkpoints/replicas-000000000040.json"
    restored, formed_again = journal.events[-2][1], journal.events[-1][1]
    assert restored["reason"] == "restored" and restored["left"] == [0, 1, 2]
    assert restored["step"] == 40
    assert formed_again["reason"] == "formed" and formed_again["restore"].endswith("40.json")
    # a master that replays the journal knows which version starts from the checkpoint
    again = GroupCoordinator(3, Journal())
    for _, data in journal.events:
        again.replay(data)
    assert again.group() == group and again.formed[group.version] == formed_again["restore"]
