"""A master that replaces one that died rebuilds the job from the journal alone
(runtime/master/recovery.py): the same tasks, ids, assignments and done sets, epoch,
phase, evaluation rounds, instance table and PS addresses; then it takes over the
instances the backend still has, and answers retried calls as the dead master would."""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.master import recovery
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.tensors import to_tensor
from elasticdl_nb.vocabulary import EventKind, InstanceState, Role
from tests.unit.masters import RecordingLauncher, built_master, started_master

OPTIONS = {"workers": 2, "ps": 1, "records": 60, "epochs": 2}


class AdoptingLauncher(RecordingLauncher):
    """The backend as a new master finds it: what still runs, what ended meanwhile."""

    def __init__(self, still_running: dict[tuple[str, int], int], ended: list[InstanceEvent]):
        super().__init__()
        self.still_running, self.ended, self.on_event = still_running, ended, None

    def adopt(self) -> set[tuple[str, int]]:
        for (role, instance), pid in self.still_running.items():
            self.on_event(InstanceEvent(role, instance, InstanceState.STARTED, pid=pid))
        for event in self.ended:
            self.on_event(event)
        return set(self.still_running) | {(e.role, e.instance_id) for e in self.ended}


def state_of(master) -> dict:
    """Everything a master keeps about its job, as plain values."""
    q = master.queue

    def task(t):
        return (t.task_id, t.kind, t.source, t.start, t.end, t.epoch, t.eval_round)

    ps = master.strategy
    return {
        "todo": [task(t) for t in q.todo],
        "doing": {
            i: (a.worker_id, task(a.task), sorted(a.done_starts)) for i, a in q.doing.items()
        },
        "done": {k: sorted(v) for k, v in q.done.items()},
        "done_count": q.done_count,
        "next_task_id": q._next_id,
        "epoch": master.epoch,
        "phase": master.phase,
        "state": master.state,
        "task_given": {w: (s, t.task_id) for w, (s, t) in master.desk._task_given.items()},
        "reports_counted": dict(master.desk._reports_counted),
        "loss_points": master.progress.loss_points,
        "rounds": {
            r: (
                e.step,
                e.tasks_left,
                e.final,
                {k: [a.tolist() for a in v] for k, v in e.states.items()},
            )
            for r, e in master.evaluations.rounds.items()
        },
        "instances": sorted(
            (str(i.role), i.instance_id, str(i.state), i.pid, i.expected_exit, i.replaces)
            for i in master.instances.instances.values()
        ),
        "desired_workers": master.instances.desired_workers,
        "next_worker_id": master.instances._next_worker_id,
        "crashes": (master.instances.counts.worker_crashes, master.instances.counts.ps_crashes),
        "ps": (ps.addresses, ps._incarnations, ps._up, ps._seen_version),
    }


def report(master, worker, task, seq, starts, done=False, states=None):
    r = pb.ProgressReport(worker_id=worker, task_id=task.task_id, seq=seq, task_done=done)
    r.batch_starts.extend(starts)
    for start in starts:
        r.losses.add(loss=0.1 * start)
    for name, values in (states or {}).items():
        r.metric_states.add(name=name, variables=[to_tensor(np.asarray(v)) for v in values])
    return master.report(r)


def a_job_with_some_history(tmp_path, journal: Journal | None = None):
    """A master after: PS ready, an epoch begun, tasks given and partly reported, an
    evaluation round half done, a worker killed and replaced, a scale-up, the PS
    restored from a checkpoint (its journal `journal`, else one in memory)."""
    master = started_master(tmp_path, journal=journal, **OPTIONS)
    ps = master.strategy
    ps.ps_ready(0, -1, "127.0.0.1:5000", incarnation=1)
    with master.lock:
        master.start_epoch(0)
    t0 = master.get_task(0, seq=1, wait_seconds=0)
    t1 = master.get_task(1, seq=1, wait_seconds=0)
    report(master, 0, t0, 1, [t0.range.start], done=True)
    t0b = master.get_task(0, seq=2, wait_seconds=0)
    report(master, 1, t1, 1, [t1.range.start])  # worker 1 holds t1, reported, not done
    with master.lock:
        master.start_evaluation(final=False)
    e0 = master.get_task(0, seq=3, wait_seconds=0)
    assert e0.type == pb.EVALUATION
    report(master, 0, e0, 2, [], done=True, states={"acc": [[3.0, 5.0]]})
    master.instances.on_event(InstanceEvent(Role.WORKER, 1, InstanceState.KILLED, pid=101))
    master.scale(3)  # worker 3
    master.instances.on_event(InstanceEvent(Role.WORKER, 3, InstanceState.STARTED, pid=103))
    ps.ps_lost(0)
    ps.ps_ready(0, 0, "127.0.0.1:5001", incarnation=2)
    assert t0b.type == pb.TRAINING
    return master


def rebuilt(tmp_path, master, launcher=None):
    events = list(master.journal.read(0, follow=False))
    new = built_master(tmp_path, launcher or RecordingLauncher(), Journal(), **OPTIONS)
    recovery.rebuild(new, events)
    return new


def test_a_new_master_rebuilt_from_the_journal_holds_what_the_dead_one_held(tmp_path):
    master = a_job_with_some_history(tmp_path)
    new = rebuilt(tmp_path, master)
    assert state_of(new) == state_of(master)
    assert new.incarnation == 1 and new.rebuilt["replayed"] == len(master.journal)
    assert new.evaluations.rounds[0].tasks_left == 1  # one of its two tasks is in


def test_the_new_master_answers_retried_calls_as_the_dead_one_would_have(tmp_path):
    master = a_job_with_some_history(tmp_path)
    new = rebuilt(tmp_path, master)
    again = new.get_task(0, seq=3, wait_seconds=0)  # worker 0's last GetTask, retried
    assert again.task_id == master.desk._task_given[0][1].task_id
    step = new.step
    t1 = next(a.task for a in new.queue.doing.values() if a.worker_id == 0)
    r = pb.ProgressReport(worker_id=0, task_id=t1.task_id, seq=2, task_done=True)  # counted
    new.report(r)
    assert new.step == step and new.progress.loss_points == master.progress.loss_points
    # and it goes on: next is the evaluation round's other task, which nobody was given
    given = {
        e.data["task"]
        for e in master.journal.read(0, follow=False)
        if e.data.get("op") == "next_for"
    }
    fresh = new.get_task(2, seq=1, wait_seconds=0)
    assert fresh.type == pb.EVALUATION and fresh.eval_round == 0 and fresh.task_id not in given


def test_the_new_master_takes_over_running_instances_and_handles_ends_it_missed(tmp_path):
    master = a_job_with_some_history(tmp_path)
    table = {(str(i.role), i.instance_id): i for i in master.instances.instances.values()}
    assert {k for k, i in table.items() if i.state == InstanceState.STARTED} == {
        ("worker", 0), ("worker", 2), ("worker", 3), ("ps", 0)
    }  # fmt: skip
    # While no master listened: worker 2 was killed; worker 3 is not there any more, and
    # the backend does not know it (say, a pod deleted by hand before it ran).
    launcher = AdoptingLauncher(
        {("worker", 0): 100, ("ps", 0): 100},
        [InstanceEvent(Role.WORKER, 2, InstanceState.KILLED, pid=102, signal="SIGKILL")],
    )
    new = built_master(tmp_path, launcher, Journal(), **OPTIONS)
    launcher.on_event = new.instances.on_event
    recovery.rebuild(new, list(master.journal.read(0, follow=False)))
    recovery.resume(new)
    # worker 2's tasks are back in the queue, a replacement (worker 4) is launched, and
    # worker 3, which the backend does not know, is started again
    assert ("worker", 4) in launcher.launched and ("worker", 3) in launcher.launched
    assert not any(a.worker_id == 2 for a in new.queue.doing.values())
    assert ("worker", 0) not in launcher.launched and ("ps", 0) not in launcher.launched
    restarted = [
        e for e in new.journal.read(0, follow=False) if e.kind == EventKind.MASTER_RESTARTED
    ]
    assert len(restarted) == 1 and restarted[0].data["adopted"] == 3


def test_a_journal_continued_by_a_new_master_has_no_gap_and_no_torn_line(tmp_path):
    path = tmp_path / "events.jsonl"
    first = Journal(path)
    for i in range(3):
        first.append(EventKind.PROGRESS, step=i)
    with open(path, "a") as f:
        f.write('{"seq":3,"ti')  # the first master was killed mid-write
    second = Journal(path)
    assert [e.seq for e in second.continued] == [0, 1, 2]
    assert second.append(EventKind.PROGRESS, step=3).seq == 3
    second.close()
    assert [e.seq for e in Journal(path).continued] == [0, 1, 2, 3]


def test_an_allreduce_master_rebuilds_the_group_and_gives_a_survivor_that_asks_again_the_same_plan(
    tmp_path,
):
    import threading

    options = {"workers": 3, "ps": 1, "records": 60, "strategy": "allreduce"}
    master = started_master(tmp_path, validation_records=0, **options)
    group = master.strategy
    joins = [
        threading.Thread(target=group.join, args=(w, f"127.0.0.1:{7000 + w}")) for w in range(3)
    ]
    for t in joins:
        t.start()
    for t in joins:
        t.join(10)
    assert group.coordinator.latest() == 1
    master.instances.on_event(InstanceEvent(Role.WORKER, 2, InstanceState.KILLED, pid=102))
    lost = [
        pb.LostReport(worker_id=w, version=1, completed_step=5, holds_result=True, suspect=-1)
        for w in (0, 1)
    ]
    plans = {}
    asks = [
        threading.Thread(target=lambda r=r: plans.__setitem__(r.worker_id, group.report_lost(r)))
        for r in lost
    ]
    for t in asks:
        t.start()
    for t in asks:
        t.join(10)
    assert plans[0] == plans[1] and plans[0].group.version == 2

    new = built_master(tmp_path, RecordingLauncher(), Journal(), validation_records=0, **options)
    recovery.rebuild(new, list(master.journal.read(0, follow=False)))
    assert new.strategy.coordinator.group(1) == group.coordinator.group(1)
    assert new.strategy.coordinator.group() == group.coordinator.group()
    assert new.strategy.report_lost(lost[1]) == plans[1]  # its reply was lost: it asks again
    assert new.strategy.get(0).members == plans[0].group.members  # (with the addresses)
    assert 2 not in new.strategy._deferred  # recovered from already
