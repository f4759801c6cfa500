"""Calls to the master are retried when their reply is lost or late (protocol/patience.py):
the master must answer a retry as it answered the first call and never do its work twice.
Where the PS serve is the master's to say: "" while one is down, its new port once back."""

from __future__ import annotations

import threading
import time

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from tests.unit.masters import started_master


def test_a_get_task_retried_with_the_same_number_gets_the_same_task(tmp_path):
    master = started_master(tmp_path)
    with master.lock:
        master.start_epoch(0)  # 4 training tasks
    first = master.get_task(0, seq=1, wait_seconds=0)
    again = master.get_task(0, seq=1, wait_seconds=0)  # its reply was lost
    assert first.type == pb.TRAINING and again == first
    assert len(master.queue.doing) == 1 and len(master.queue.todo) == 3
    following = master.get_task(0, seq=2, wait_seconds=0)
    assert following.task_id != first.task_id and len(master.queue.todo) == 2


def test_a_waiting_get_task_overtaken_by_its_retry_gives_nothing_away(tmp_path):
    master = started_master(tmp_path, records=0)
    with master.lock:
        master.start_epoch(0)  # training has begun and the queue is empty: calls wait for work
    answers: dict[str, pb.Task] = {}

    def ask(label: str) -> None:
        answers[label] = master.get_task(0, seq=7, wait_seconds=5)

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    time.sleep(0.2)  # the first call waits; its caller gave up and retries
    retry = threading.Thread(target=ask, args=("retry",))
    retry.start()
    first.join(1)  # it gives up at once, not at its deadline
    assert answers["first"].type == pb.NONE  # (nobody reads it)
    with master.lock:
        master.start_evaluation(final=False)  # work appears: 2 evaluation tasks
    retry.join(5)
    assert answers["retry"].type == pb.EVALUATION
    held = [a.task.task_id for a in master.queue.doing.values() if a.worker_id == 0]
    assert held == [answers["retry"].task_id]


def test_a_progress_report_retried_with_the_same_number_is_counted_once(tmp_path):
    master = started_master(tmp_path)
    with master.lock:
        master.start_epoch(0)
    task = master.get_task(0, seq=1, wait_seconds=0)
    report = pb.ProgressReport(
        worker_id=0, task_id=task.task_id, batch_starts=[task.range.start], seq=1
    )
    report.losses.add(loss=0.5)
    for _ in range(3):  # sent, and twice more as if each reply had been lost
        assert not master.report(report).stop
    losses = [e for e in master.journal.read(0, follow=False) if e.kind == "loss"]
    assert len(losses) == 1 and master.progress.loss_points == 1
    assert master.step == 1
    report.seq, report.batch_starts[:] = 2, []
    master.report(report)
    assert master.progress.loss_points == 2  # a new number is a new report


def test_the_ps_addresses_follow_each_ps_and_a_retried_ready_is_no_relaunch(tmp_path):
    master = started_master(tmp_path, ps=2)
    ps = master.strategy
    assert ps.addresses_now() == ["", ""]
    ps.ps_ready(0, -1, "127.0.0.1:5000", incarnation=11)
    ps.ps_ready(0, -1, "127.0.0.1:5000", incarnation=11)  # the same report, retried
    ps.ps_ready(1, -1, "127.0.0.1:5001", incarnation=12)
    assert ps.addresses_now() == ["127.0.0.1:5000", "127.0.0.1:5001"]
    assert not any(e.kind == "ps_restored" for e in master.journal.read(0, follow=False))

    from elasticdl_nb.runtime.master.site import InstanceEvent
    from elasticdl_nb.vocabulary import InstanceState

    master.instances.on_event(InstanceEvent("ps", 0, InstanceState.KILLED, signal="SIGKILL"))
    assert ps.addresses_now() == ["", "127.0.0.1:5001"]  # nobody calls its old port
    assert ps.stubs[0] is None
    ps.ps_ready(0, 3, "127.0.0.1:6000", incarnation=13)  # relaunched, on a new port
    assert ps.addresses_now() == ["127.0.0.1:6000", "127.0.0.1:5001"]
    restored = [e.data for e in master.journal.read(0, follow=False) if e.kind == "ps_restored"]
    assert [r["ps"] for r in restored] == [0]
