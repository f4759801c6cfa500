"""Goodput (runtime/master/goodput.py): training over wanted worker time, folded from the
journal; the same figures in the master that wrote the events and in one rebuilt from
them; 1.0 without faults."""

from __future__ import annotations

import pytest

from elasticdl_nb.runtime.master import recovery
from elasticdl_nb.runtime.master.goodput import Goodput
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.vocabulary import InstanceState, Role
from tests.unit.masters import RecordingLauncher, built_master
from tests.unit.timed_journal import T0, TimedJournal


def worker(journal, when, worker_id, kind, expected=False, **more):
    journal.at(when, "instance", role="worker", id=worker_id, kind=kind, expected=expected, **more)


def applied(journal, when, worker_id, starts=(0,)):
    journal.at(when, "queue", op="report", task_id=1, starts=list(starts), worker=worker_id)


def started(journal, workers=4):
    journal.at(0, "job_state", state="running", reason="started")
    journal.at(0, "scale", workers_from=0, workers_to=workers, reason="job start")
    for w in range(workers):
        worker(journal, 1, w, "started")
    applied(journal, 10, 0)  # the clock starts: t = 10


def figures(journal, now, workers=4):
    return Goodput(journal, workers).fields(now=T0 + now)


def test_a_run_without_faults_has_goodput_one():
    j = TimedJournal()
    started(j)
    applied(j, 50, 1)
    # an evaluation, a scale-up (its worker starting is not recovery), a scale-down
    j.at(60, "evaluation_task", round=0, worker=2, states={})
    j.at(70, "scale", workers_from=4, workers_to=5, reason="requested")
    worker(j, 71, 4, "started")
    worker(j, 90, 4, "retiring")
    j.at(90, "scale", workers_from=5, workers_to=4, reason="requested")
    worker(j, 91, 4, "succeeded", expected=True)
    worker(j, 100, 0, "succeeded")  # the job's end: workers exit with 0
    j.at(101, "job_state", state="succeeded", reason="all epochs done")
    assert figures(j, now=500) == {"goodput": 1.0, "training_s": 4 * 91 + 20, "recovering_s": 0.0}


def test_the_workers_wanted_are_what_the_throughput_policy_asks_for():
    j = TimedJournal()
    j.at(0, "job_state", state="running", reason="started")
    j.at(0, "growth", workers=0, asked=1, holding=False, reason="starting at MIN: 1")
    j.at(0, "scale", workers_from=0, workers_to=4, reason="job start", min_workers=1)
    worker(j, 1, 0, "started")
    applied(j, 10, 0)
    j.at(30, "growth", workers=1, asked=2, holding=False, reason="...", samples_per_s=9.0)
    worker(j, 31, 1, "started")
    # 1 wanted for 20 s, then 2 (not the range's MAX of 4)
    assert figures(j, now=50)["training_s"] == 1 * 20 + 2 * 20
    j.at(50, "scale", workers_from=2, workers_to=3, reason="requested")  # a fixed count
    assert figures(j, now=60)["training_s"] == 1 * 20 + 2 * 20 + 3 * 10


def test_no_goodput_before_the_first_minibatch():
    j = TimedJournal()
    j.at(0, "scale", workers_from=0, workers_to=2, reason="job start")
    worker(j, 5, 0, "killed", signal="SIGKILL")  # before training: counted from its start
    assert figures(j, now=20, workers=2)["goodput"] is None
    applied(j, 30, 1)
    assert figures(j, now=40, workers=2) == {
        "goodput": 0.5,
        "training_s": 10.0,
        "recovering_s": 10.0,
    }


def test_a_killed_worker_s_slot_recovers_until_its_replacement_applies_a_minibatch():
    j = TimedJournal()
    started(j)
    worker(j, 20, 2, "killed", signal="SIGKILL")
    j.at(20, "relaunch", role="worker", id=4, replaces=2, reason="killed by SIGKILL")
    worker(j, 21, 4, "started")
    applied(j, 25, 0)  # another worker's work closes nothing
    assert figures(j, now=30)["recovering_s"] == 10.0  # still open: 20 -> now
    applied(j, 32, 4)  # the replacement's first minibatch
    f = figures(j, now=110)
    assert f["recovering_s"] == 12.0 and f["training_s"] == 4 * 100 - 12
    assert f["goodput"] == pytest.approx(1 - 12 / 400, abs=1e-4)


def test_a_replacement_that_dies_before_training_keeps_the_slot_recovering():
    j = TimedJournal()
    started(j)
    worker(j, 20, 2, "oom")
    j.at(20, "relaunch", role="worker", id=4, replaces=2, reason="oom")
    worker(j, 30, 4, "failed", exit_code=1)
    j.at(30, "relaunch", role="worker", id=5, replaces=4, reason="exit code 1")
    applied(j, 40, 5)
    assert figures(j, now=110)["recovering_s"] == 20.0  # one slot, 20 -> 40, not two


def test_a_lost_ps_makes_every_slot_recover_until_it_is_ready_and_work_goes_on():
    j = TimedJournal()
    started(j)
    j.at(20, "instance", role="ps", id=0, kind="killed", expected=False)
    j.at(20, "relaunch", role="ps", id=0, replaces=0, reason="killed by SIGKILL")
    j.at(26, "instance", role="ps", id=0, kind="running", address="a:1", incarnation=2)
    j.at(27, "ps_restored", ps=0, restored_version=3, newest_seen_version=9)
    applied(j, 28, 1)  # work goes on: 4 slots x 8 s
    worker(j, 40, 3, "killed")  # and a worker while no PS is down: one slot
    j.at(40, "relaunch", role="worker", id=4, replaces=3, reason="killed")
    applied(j, 45, 4)
    f = figures(j, now=110)
    assert f["recovering_s"] == 4 * 8 + 5 and f["goodput"] == round(1 - 37 / 400, 4)


def test_slots_recovering_never_exceed_the_desired_workers():
    j = TimedJournal()
    started(j, workers=2)
    j.at(20, "instance", role="ps", id=0, kind="failed", exit_code=1)
    worker(j, 22, 0, "killed")  # while the PS is down: every slot counts once
    j.at(22, "relaunch", role="worker", id=2, replaces=0, reason="killed")
    j.at(30, "instance", role="ps", id=0, kind="running", address="a:1", incarnation=2)
    applied(j, 31, 1)
    applied(j, 35, 2)
    # 20 -> 31: both slots (22 s); 31 -> 35: worker 0's slot (4 s)
    assert figures(j, now=110, workers=2)["recovering_s"] == 26.0


def test_the_master_s_downtime_and_an_allreduce_stall_are_every_slot_s():
    j = TimedJournal()
    started(j, workers=2)
    applied(j, 20, 1)  # seq 5: the last event of the master that dies
    worker(j, 29, 0, "running")  # the new master's adoption, before it says it took over
    j.at(30, "master_restarted", incarnation=1, replayed=6, down_s=9.5, adopted=3)
    j.at(50, "group_settled", version=3, step=9, seconds=1.5, cause="failure",
         completed_at=T0 + 49.0, worker=0)  # fmt: skip
    j.at(60, "group_settled", version=4, step=19, seconds=3.0, cause="joined",
         completed_at=T0 + 59.0, worker=0)  # fmt: skip
    assert figures(j, now=110, workers=2)["recovering_s"] == 2 * (10 + 1.5)


def test_a_refused_relaunch_leaves_the_slot_recovering_until_it_is_scaled_away():
    j = TimedJournal()
    started(j, workers=3)
    worker(j, 20, 1, "failed", exit_code=3)
    j.at(20, "relaunch_refused", role="worker", id=1, reason="budget spent")
    j.at(50, "scale", workers_from=2, workers_to=2, reason="requested")
    f = figures(j, now=110, workers=3)
    assert f["recovering_s"] == 30.0 and f["training_s"] == 3 * 40 + 2 * 60 - 30


def test_a_rebuilt_master_reports_the_goodput_the_dead_one_did(tmp_path):
    path = tmp_path / "events.jsonl"
    launcher = RecordingLauncher()
    master = built_master(tmp_path, launcher, TimedJournal(path), workers=2, records=60)
    master.journal.now = T0
    master.start_instances()
    for role, instance in launcher.launched:
        master.instances.on_event(InstanceEvent(role, instance, InstanceState.STARTED, pid=9))
    master.strategy.ps_ready(0, -1, "127.0.0.1:5000", incarnation=1)
    with master.lock:
        master.start_epoch(0)
    journal = master.journal
    journal.now = T0 + 10
    task = master.get_task(0, seq=1, wait_seconds=0)
    r = pb.ProgressReport(worker_id=0, task_id=task.task_id, seq=1, task_done=True)
    r.batch_starts.append(task.range.start)
    master.report(r)  # the clock starts
    journal.now = T0 + 20
    master.instances.on_event(InstanceEvent(Role.WORKER, 1, InstanceState.KILLED, pid=9))
    assert [e.data["replaces"] for e in journal.read(0, follow=False) if e.kind == "relaunch"] == [
        1
    ]
    live = master.goodput.fields(now=T0 + 40)
    assert live == {"goodput": 0.6667, "training_s": 40.0, "recovering_s": 20.0}
    assert master.status()["goodput"] < 1.0  # (now: the clock's time)

    journal.close()  # (the dead master's file)
    new = built_master(tmp_path, RecordingLauncher(), TimedJournal(path), workers=2, records=60)
    recovery.rebuild(new, new.journal.continued)
    assert new.goodput.fields(now=T0 + 40) == live
    new.journal.close()
