"""A worker range (`workers="2:6"`): how every front end reads it, which workers the
master launches at the elastic priority, when training waits below MIN, and what the
client's fold of the journal shows (pending workers with the scheduler's reason, the
floor). The real master and instance manager; a recording launcher instead of pods
(the real node's tests: tests/kubernetes/test_elastic_scheduling.py)."""

from __future__ import annotations

import io

import pytest

from elasticdl_nb import cli
from elasticdl_nb.magics.config import ElasticDL, assign
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.sdk.progress import ProgressPrinter
from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.spec import JobSpec, SpecError
from elasticdl_nb.vocabulary import EventKind, InstanceState, Strategy
from tests.unit.masters import RecordingLauncher, built_master

UNSCHEDULABLE = "unschedulable: 0/1 nodes are available: 1 Insufficient cpu."


# ---------------------------------------------------------------- reading a range


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2:6", (2, 6)), ((1, 3), (1, 3)), ("4", (0, 4)), (5, (0, 5)), (" 3:3 ", (3, 3))],
)
def test_a_range_sets_min_and_max(value, expected):
    spec = JobSpec.from_options(data=["x"], workers=value)
    assert (spec.min_workers, spec.workers) == expected
    assert spec.workers_text == (f"{expected[0]}:{expected[1]}" if expected[0] else str(value))
    assert JobSpec.from_json(spec.to_json()) == spec  # (the master reads it back)


@pytest.mark.parametrize(
    ("value", "says"),
    [("6:2", "1 <= MIN <= MAX"), ("0:3", "1 <= MIN <= MAX"), ("a:b", "write N"), ("x", "write N")],
)
def test_a_bad_range_says_how_to_write_one(value, says):
    with pytest.raises(SpecError, match=says):
        JobSpec.from_options(data=["x"], workers=value)


def test_min_above_max_given_apart_is_refused():
    with pytest.raises(SpecError, match="above workers=3"):
        JobSpec.from_options(data=["x"], workers=3, min_workers=4)


def test_the_cli_the_magic_defaults_and_config_take_a_range(monkeypatch):
    args = vars(cli.build_parser().parse_args(["train", "--data", "x", "--workers", "2:6"]))
    assert args["workers"] == "2:6"
    assert cli.build_parser().parse_args(["scale", "j", "--workers", "1:4"]).workers == "1:4"
    config = ElasticDL()
    assign(config, ["workers=2:5"])
    assert config.workers == "2:5"
    config.workers = 3  # `%config ElasticDL.workers = 3` stays a number
    assert config.workers == 3


# ---------------------------------------------------------------- the master


def instance(master, worker: int, kind: InstanceState, reason: str = "") -> None:
    master.instances.on_event(InstanceEvent("worker", worker, kind, reason=reason))


def test_the_first_min_workers_are_base_the_rest_elastic(tmp_path):
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, Journal(), workers="2:4")
    master.start_instances()
    workers = [i for role, i in launcher.launched if role == "worker"]
    assert workers == [0, 1, 2, 3] and launcher.elastic == {2, 3}
    # A base worker preempted: its replacement is base again (the job lacks one).
    instance(master, 0, InstanceState.PREEMPTED, "Preempted by the scheduler")
    assert launcher.launched[-1] == ("worker", 4) and 4 not in launcher.elastic
    # An elastic one preempted: its replacement is elastic.
    instance(master, 3, InstanceState.PREEMPTED, "Preempted by the scheduler")
    assert launcher.launched[-1] == ("worker", 5) and 5 in launcher.elastic
    # Scaling down retires the elastic workers first, the newest first.
    master.scale(3, min_workers=2)
    retiring = [
        e.data["id"]
        for e in master.journal.read(0, follow=False)
        if e.kind == EventKind.INSTANCE and e.data["kind"] == InstanceState.RETIRING
    ]
    assert retiring == [5]
    elastic_events = {
        e.data["id"]
        for e in master.journal.read(0, follow=False)
        if e.kind == EventKind.INSTANCE and e.data.get("elastic")
    }
    assert elastic_events == {3}  # (only instances that reported: 3 was preempted)


def test_a_fixed_number_has_no_elastic_workers(tmp_path):
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, Journal(), workers=3)
    master.start_instances()
    assert launcher.elastic == set() and master.floor.minimum == 0


def test_a_new_master_knows_the_range_and_each_workers_tier(tmp_path):
    from elasticdl_nb.runtime.master.recovery import rebuild

    journal = Journal()
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, journal, workers="2:4")
    master.start_instances()
    for worker in range(4):
        instance(master, worker, InstanceState.RUNNING)
    master.scale(5, min_workers=3)
    again = built_master(tmp_path, RecordingLauncher(), Journal(), workers="2:4")
    rebuild(again, list(journal.read(0, follow=False)))
    assert (again.instances.min_workers, again.instances.desired_workers) == (3, 5)
    tiers = {w: again.instances.instances[("worker", w)].elastic for w in range(4)}
    assert tiers == {0: False, 1: False, 2: True, 3: True}


def ask(master, worker: int) -> int:
    """The kind of task a worker's GetTask gets (waiting only briefly)."""
    return master.get_task(worker, wait_seconds=0.05).type


def floor_events(master) -> list[dict]:
    return [e.data for e in master.journal.read(0, follow=False) if e.kind == "worker_floor"]


def test_a_ps_job_trains_once_min_workers_run_and_waits_below(tmp_path):
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, Journal(), workers="2:3", records=200)
    master.start_instances()
    with master.lock:  # (the coordinator's step)
        master.start_epoch(0)
    for worker in range(3):
        instance(master, worker, InstanceState.STARTED)
    master.floor.check()
    assert floor_events(master) == [{"running": 0, "min": 2, "below": True, "held": True}]
    assert ask(master, 0) == pb.NONE  # one runs: below MIN, no training task
    assert ask(master, 1) == pb.TRAINING  # two: training starts, without the third
    assert ask(master, 0) == pb.TRAINING
    assert floor_events(master)[-1] == {"running": 2, "min": 2, "below": False, "held": False}
    instance(master, 1, InstanceState.PREEMPTED, "Preempted by the scheduler")
    assert floor_events(master)[-1]["below"] is True
    assert master.state == "running"  # waiting, not failed
    assert ask(master, 0) == pb.NONE
    assert ask(master, 2) == pb.TRAINING  # the third comes: enough again
    master.scale(3, min_workers=1)  # a lower MIN
    assert master.floor.held() is False


def test_an_allreduce_group_forms_at_min_and_goes_on_below_it(tmp_path):
    launcher = RecordingLauncher()
    master = built_master(
        tmp_path, launcher, Journal(), workers="2:4", strategy=Strategy.ALLREDUCE, ps=1
    )
    assert master.strategy.coordinator.expected == 2
    master.start_instances()
    for worker in range(4):
        instance(master, worker, InstanceState.STARTED)
    master.floor.check()
    assert floor_events(master)[-1]["held"] is False  # journaled, not held


# ---------------------------------------------------------------- what the client shows


def test_the_view_shows_pending_workers_with_the_schedulers_reason_and_the_floor(tmp_path):
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, Journal(), workers="2:4", records=200)
    master.start_instances()
    master.floor.check()
    for worker in range(3):
        instance(master, worker, InstanceState.RUNNING)
    instance(master, 3, InstanceState.PENDING, UNSCHEDULABLE)
    out = io.StringIO()
    printer = ProgressPrinter("j", out=out)
    view = printer.view = JobView("j", workers=4, min_workers=2)
    for event in master.journal.read(0, follow=False):
        printer.show(event)
    summary = view.summary()["workers"]
    assert summary == {
        "live": 3,
        "desired": 4,
        "min": 2,
        "pending": 1,
        "pending_reason": UNSCHEDULABLE,
        "waiting": "0 of at least 2 workers running: training waits",
        "growth": "",
    }
    assert view.timeline.now() == (3, 4, 1)
    status = master.status()  # (what Job.status() returns)
    assert status["pending_workers"] == [{"id": 3, "reason": UNSCHEDULABLE}]
    assert (status["workers"], status["running_workers"]) == (4, 3)  # as the view's live
    assert (status["min_workers"], status["desired_workers"]) == (2, 4)
    assert status["waiting_for_workers"] is True
    assert f"worker 3 pending: {UNSCHEDULABLE}" in out.getvalue()
    assert "waiting for workers: 0 of at least 2 running; training waits" in out.getvalue()
    ask(master, 0), ask(master, 1)  # two ask for work: enough
    instance(master, 3, InstanceState.RUNNING)
    for event in master.journal.read(view.last_seq + 1, follow=False):
        printer.show(event)
    summary = view.summary()["workers"]
    assert (summary["live"], summary["pending"], summary["waiting"]) == (4, 0, "")
    assert "2 workers running (at least 2): training goes on" in out.getvalue()
