"""Every replica of an allreduce job lost at once: the master goes back to the replicas'
newest checkpoint (what it holds stays done, the rest is queued again, the next group
starts from it), or fails saying why when there is none yet."""

from __future__ import annotations

import threading

from elasticdl_nb.runtime.collective import checkpoints
from elasticdl_nb.runtime.collective.checkpoints import Applied, CheckpointWriter
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.vocabulary import InstanceState, Role
from tests.unit.masters import started_master

OPTIONS = {"workers": 2, "ps": 1, "records": 60, "validation_records": 0, "strategy": "allreduce"}


def _trained_a_little(tmp_path):
    """Both members in the group; three minibatches reported applied."""
    master = started_master(tmp_path, **OPTIONS)
    joins = [threading.Thread(target=master.strategy.join, args=(w, f"h:{w}")) for w in (0, 1)]
    for t in joins:
        t.start()
    for t in joins:
        t.join(10)
    with master.lock:
        master.start_epoch(0)
    tasks = [master.get_task(w, seq=1, wait_seconds=0) for w in (0, 1)]
    for seq, task in enumerate(tasks, 1):
        master.report(
            pb.ProgressReport(
                worker_id=0, task_id=task.task_id, seq=seq, batch_starts=[task.range.start]
            )
        )
    t2 = master.get_task(0, seq=2, wait_seconds=0)
    master.report(
        pb.ProgressReport(worker_id=0, task_id=t2.task_id, seq=3, batch_starts=[t2.range.start])
    )
    return master, [t.range.start for t in (*tasks, t2)]


def _all_killed(master):
    for w in (0, 1):
        master.instances.on_event(InstanceEvent(Role.WORKER, w, InstanceState.KILLED, pid=100 + w))


def test_every_replica_lost_goes_back_to_the_checkpoint_and_queues_the_rest_again(tmp_path):
    master, starts = _trained_a_little(tmp_path)
    held = Applied(10)
    held.add([(0, 0, s) for s in starts[:2]])  # the checkpoint holds the first two only
    writer = CheckpointWriter(JobDir(tmp_path).checkpoints, every=1, keep=3, member=0)
    writer.maybe_save(2, 1, lambda: [], held)
    writer.close()

    _all_killed(master)

    assert master.state == "running"
    assert master.queue.done[(0, 0)] == set(starts[:2])
    queued = {t.start for t in master.queue.todo}
    assert starts[2] in queued and not queued & set(starts[:2])
    assert len(queued) == 6 - 2  # every other minibatch of the epoch, once
    group = master.strategy.get(0)
    assert group.members == [] and master.strategy.coordinator.formed == {1: ""}
    assert checkpoints.rollbacks(JobDir(tmp_path).replicas) == [{"step": 2, "workers": [0, 1]}]
    # the replacements' group starts from the checkpoint
    joins = {}
    threads = [
        threading.Thread(target=lambda w=w: joins.__setitem__(w, master.strategy.join(w, f"h:{w}")))
        for w in (2, 3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert joins[2] == joins[3] and joins[2].restore.endswith("replicas-000000000002.json")
    assert joins[2].state_from == joins[2].members[0].worker


def test_every_replica_lost_before_the_first_checkpoint_fails_the_job_saying_so(tmp_path):
    master, _ = _trained_a_little(tmp_path)
    _all_killed(master)
    assert master.state == "failed"
    assert "before the replicas' first checkpoint" in master.error
