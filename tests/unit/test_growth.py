"""The throughput growth policy (runtime/master/growth.py) on a made-up job: a clock the
test moves, workers that run when asked for, and samples at a rate the test chooses for
each worker count."""

from __future__ import annotations

import pytest

from elasticdl_nb.runtime.master.growth import ThroughputGrowth, ordinal
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.sdk.view.text import format_workers
from elasticdl_nb.spec import JobSpec, SpecError
from elasticdl_nb.vocabulary import EventKind
from tests.unit.masters import RecordingLauncher, built_master


class MadeUpJob:
    """Workers run as soon as they are asked for; samples accrue at `rates[workers]`."""

    def __init__(self, rates: dict[int, float], low: int = 1, high: int = 6):
        self.rates, self.low, self.high = rates, low, high
        self.now, self.samples, self.running = 0.0, 0.0, 0
        self.events: list[dict] = []
        self.growth = ThroughputGrowth(
            lambda kind, **data: self.events.append({"kind": kind, **data}),
            bounds=lambda: (self.low, self.high),
            running=lambda: self.running,
            samples=lambda: int(self.samples),
            converge=self.converge,
            clock=lambda: self.now,
        )

    def converge(self) -> None:
        asked = self.growth.asked
        self.running = self.high if asked is None else min(asked, self.high)

    def run(self, seconds: float, training: bool = True) -> None:
        for _ in range(int(seconds * 2)):
            self.now += 0.5
            self.samples += self.rates.get(self.running, 0.0) * 0.5
            self.growth.tick(training)

    def decisions(self) -> list[tuple]:
        return [(e["workers"], e["asked"], e["holding"]) for e in self.events]


def test_it_grows_one_worker_at_a_time_and_gives_back_the_one_that_adds_too_little():
    job = MadeUpJob({1: 100.0, 2: 190.0, 3: 250.0, 4: 255.0})
    job.growth.start()
    job.converge()
    assert job.running == 1
    job.run(200)
    assert job.decisions() == [(0, 1, False), (1, 2, False), (2, 3, False), (3, 4, False),
                               (4, 3, True)]  # fmt: skip
    assert job.running == 3 and job.growth.holding
    assert job.growth.reason == "holding at 3: the 4th added 2%"
    held = job.events[-1]
    assert held["kind"] == EventKind.GROWTH and held["gain"] == pytest.approx(0.02, abs=1e-3)
    assert held["samples_per_s"] == pytest.approx(255.0, rel=0.03)

    job.run(200)  # holding: no more measurements
    assert len(job.events) == 5


def test_it_stops_at_the_ranges_max_and_a_new_range_starts_it_over_from_what_runs():
    job = MadeUpJob({n: 100.0 * n for n in range(1, 8)}, low=2, high=3)
    job.growth.start()
    job.converge()
    job.run(200)
    assert job.decisions()[-1] == (3, 3, True)
    assert job.growth.reason == "holding at 3, the range's MAX: the 3rd added 50%"

    job.low, job.high = 2, 5
    job.growth.rescaled()
    assert job.growth.asked == 3 and not job.growth.holding
    job.run(300)
    assert job.decisions()[-1] == (5, 5, True)

    job.low = 0  # a fixed count: the policy lets go
    job.growth.rescaled()
    assert job.growth.asked is None and job.running == 5


def test_a_window_starts_over_when_a_worker_is_lost_or_training_pauses():
    job = MadeUpJob({1: 100.0, 2: 200.0})
    job.growth.start()
    job.converge()
    job.run(20)  # settled, the window half full
    job.running = 0  # lost
    job.run(20)
    job.running = 1
    job.run(20, training=False)  # an evaluation round
    assert len(job.events) == 1  # only the start: nothing measured yet
    job.run(26)
    assert job.decisions()[-1] == (1, 2, False)


def test_a_master_that_takes_over_asks_for_what_the_last_one_asked_for():
    job = MadeUpJob({1: 100.0, 2: 190.0, 3: 250.0, 4: 255.0})
    job.growth.start()
    job.converge()
    job.run(200)
    again = MadeUpJob(job.rates)
    for e in job.events:
        again.growth.replay(e["kind"], {k: v for k, v in e.items() if k != "kind"})
    assert (again.growth.asked, again.growth.holding) == (3, True)
    assert again.growth.rates == job.growth.rates


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"
    ]  # fmt: skip


# ---------------------------------------------------------------- in the master


def test_the_master_asks_for_min_first_and_a_scale_starts_the_policy_over(tmp_path):
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, Journal(), workers="1:4", scale_policy="throughput")
    master.start_instances()
    assert [r for r, _ in launcher.launched] == ["ps", "worker"]
    assert master.status()["growth"] == {
        "asked": 1, "holding": False, "reason": "starting at MIN: 1"
    }  # fmt: skip
    assert master.status()["desired_workers"] == 4  # (the range's MAX stays what is desired)

    master.scale(5, min_workers=3)
    assert [r for r, _ in launcher.launched].count("worker") == 3
    view = JobView("j", workers=4, min_workers=1)
    for event in master.journal.read(0, follow=False):
        view.apply(event)
    assert view.workers_summary()["growth"] == "a new range 3:5: measuring again from 3"
    assert "; a new range 3:5" in format_workers(view.workers_summary())

    master.scale(2)  # a fixed count: the policy lets go, the instance manager asks for 2
    assert master.growth.asked is None and master.instances.asked_workers == 2
    assert master.status()["growth"]["reason"] == ""
    for event in master.journal.read(view.last_seq + 1, follow=False):
        view.apply(event)
    assert view.workers_summary()["growth"] == ""  # nothing stale once the policy let go


@pytest.mark.parametrize(
    ("options", "says"),
    [({"workers": 4}, "grows a worker range"),
     ({"workers": "1:4", "strategy": "allreduce"}, "measures PS jobs")],
)  # fmt: skip
def test_the_policy_needs_a_range_and_the_ps_strategy(options, says):
    with pytest.raises(SpecError, match=says):
        JobSpec.from_options(data=["x"], scale_policy="throughput", **options)
