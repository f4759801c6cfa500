"""Straggler detection (runtime/master/stragglers.py), from synthetic `worker_time`
events: a worker whose step time stays above twice the others' median is flagged after
SUSTAIN_S, nobody else is, and it is cleared when it catches up or ends; allreduce
members are judged by their own compute time."""

from __future__ import annotations

import random
import statistics

from elasticdl_nb.runtime.master.stragglers import SUSTAIN_S, Stragglers, _median_without
from tests.unit.timed_journal import T0, TimedJournal

TASK = 4  # minibatches per task


class Job:
    """Workers that report a training task every `step * TASK` seconds each."""

    def __init__(self, workers=3, strategy="ps"):
        self.journal = TimedJournal()
        self.stragglers = Stragglers(self.journal, strategy)
        self.steps = {w: 0.05 for w in range(workers)}  # seconds per minibatch
        self.next = {w: 1.0 + 0.01 * w for w in range(workers)}  # its next report
        self.ps = strategy == "ps"
        for w in range(workers):
            self.journal.at(0.5, "instance", role="worker", id=w, kind="started")

    def run_until(self, t: float) -> None:
        while min(self.next.values()) <= t:
            w = min(self.next, key=self.next.get)
            took = self.steps[w] * TASK
            wall = max(self.steps.values()) * TASK if not self.ps else took
            self.journal.at(self.next[w], "worker_time", worker=w, task=0, minibatches=TASK,
                            task_s=wall, compute_s=took, wait_s=wall - took)  # fmt: skip
            self.stragglers.check()
            self.next[w] += wall

    def events(self, kind: str) -> list[tuple[float, dict]]:
        return [(e.time - T0, e.data) for e in self.journal.read(0, follow=False) if e.kind == kind]


def test_a_slowed_worker_is_flagged_after_the_sustain_window_and_nobody_else():
    job = Job()
    job.run_until(20)
    job.steps[2] = 0.2  # 4x slower from t = 20
    job.run_until(60)
    [(when, flag)] = job.events("straggler")
    assert flag["worker"] == 2 and flag["ratio"] == 4.0
    assert (flag["step_s"], flag["median_s"]) == (0.2, 0.05)
    assert SUSTAIN_S <= when - 20 <= SUSTAIN_S + 3  # a few slow tasks, then the window
    assert job.stragglers.status() == [flag]
    assert job.events("straggler_cleared") == []

    job.steps[2] = 0.05  # it catches up
    job.run_until(100)
    [(cleared, data)] = job.events("straggler_cleared")
    assert data["worker"] == 2 and data["reason"] == "caught up" and cleared > 60 + SUSTAIN_S
    assert job.stragglers.status() == []


def test_a_brief_slowdown_and_noise_flag_nobody():
    job = Job(workers=4)
    for t in range(10, 130, 10):  # each worker in turn 1.6x slower than the others
        job.steps = {w: 0.05 * (1 + 0.6 * ((w + t // 10) % 3 == 0)) for w in job.steps}
        job.run_until(t)
    job.steps[1] = 0.3  # 6x, for less than the sustain window
    job.run_until(120 + SUSTAIN_S - 1)
    job.steps[1] = 0.05
    job.run_until(150)
    assert job.events("straggler") == []


def test_an_allreduce_member_is_judged_by_its_own_compute_time():
    job = Job(strategy="allreduce")
    job.run_until(20)
    job.steps[0] = 0.15  # every member's wall time grows with it; its compute alone
    job.run_until(60)
    flags = [d["worker"] for _, d in job.events("straggler")]
    assert flags == [0]


def test_a_straggler_that_ends_is_cleared_and_a_new_master_sees_the_same(tmp_path):
    job = Job()
    job.run_until(10)
    job.steps[1] = 0.25
    job.run_until(40)
    assert [d["worker"] for _, d in job.events("straggler")] == [1]

    rebuilt = Stragglers(job.journal, "ps")  # a new master folds the same journal
    assert rebuilt.status() == job.stragglers.status()

    job.journal.at(41, "instance", role="worker", id=1, kind="killed", expected=False)
    del job.steps[1], job.next[1]
    job.run_until(43)
    [(_, cleared)] = job.events("straggler_cleared")
    assert cleared == {"worker": 1, "reason": "ended"}
    rebuilt.check()  # it has journaled that already: nothing twice
    assert len(job.events("straggler_cleared")) == 1 and rebuilt.status() == []


def test_the_median_of_the_others_is_the_median_of_the_rest():
    """A judgement takes each worker's value out of one sorted list (not a list of the
    others per worker): the same median as a copy without it, ties and all."""
    rng = random.Random(39)
    for _ in range(2000):
        values = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(rng.randint(2, 12))]
        value = rng.choice(values)
        rest = list(values)
        rest.remove(value)
        assert _median_without(sorted(values), value) == statistics.median(rest)
