"""Dynamic sharding: tasks aligned to minibatches, exact re-queueing of lost work."""

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.master.tasks import TRAINING, TaskQueue


def _queue(records=(100, 30), batch=10, per_task=3, shuffle=False):
    sources = [SourceInfo(f"/d/{i}.csv", "csv", n) for i, n in enumerate(records)]
    return TaskQueue(sources, [], batch, per_task, shuffle, seed=7)


def _ranges(tasks):
    return [(t.source, t.start, t.end) for t in tasks]


def test_an_epoch_covers_every_record_once_in_minibatch_aligned_tasks():
    queue = _queue()
    assert queue.add_epoch(0) == 4 + 1
    assert _ranges(queue.todo) == [(0, 0, 30), (0, 30, 60), (0, 60, 90), (0, 90, 100), (1, 0, 30)]


def test_shuffled_epochs_differ_but_are_reproducible():
    a, b = _queue(records=(1000,), shuffle=True), _queue(records=(1000,), shuffle=True)
    a.add_epoch(0), a.add_epoch(1), b.add_epoch(0)
    first, second = _ranges(list(a.todo)[:34]), _ranges(list(a.todo)[34:])
    assert first == _ranges(b.todo) and first != second
    assert sorted(first) == sorted(second)


def test_a_lost_worker_gives_back_exactly_its_unreported_minibatches():
    queue = _queue()
    queue.add_epoch(0)
    task = queue.next_for(worker_id=7)
    assert queue.report(task.task_id, [0, 10]) == [0, 10]
    released = queue.release_worker(7)
    assert [(t.task_id, left) for t, left in released] == [(task.task_id, [20])]
    redo = queue.next_for(worker_id=8)
    assert (redo.kind, redo.start, redo.end) == (TRAINING, 20, 30)
    assert queue.done_count == 2


def test_reports_of_minibatches_already_done_are_not_counted_twice():
    queue = _queue()
    queue.add_epoch(0)
    task = queue.next_for(1)
    queue.report(task.task_id, [0, 10])
    assert queue.report(task.task_id, [10, 20]) == [20]
    assert queue.done_count == 3


def test_settling_an_epoch_requeues_what_no_ps_holds_and_counts_what_was_not_reported():
    queue = _queue(records=(60,))
    queue.add_epoch(0)
    a, b = queue.next_for(1), queue.next_for(1)
    queue.report(a.task_id, [0, 10, 20])
    queue.finish(a.task_id), queue.finish(b.task_id)  # b's report was lost
    missing = queue.settle(0, 0, held={0, 10, 30, 40, 50})
    assert missing == [20]
    assert queue.done[(0, 0)] == {0, 10, 30, 40, 50}
    assert _ranges(queue.todo) == [(0, 20, 30)]


def test_requeued_runs_are_split_into_tasks_of_at_most_the_task_size():
    queue = _queue(records=(100,), per_task=2)
    tasks = queue.requeue_batches(0, 0, [0, 10, 20, 50, 90], "test")
    assert _ranges(tasks) == [(0, 0, 20), (0, 20, 30), (0, 50, 60), (0, 90, 100)]


def test_a_minibatch_named_twice_in_one_report_counts_once():
    # After an allreduce failure the master reports every survivor's account at once, and
    # each survivor names the same minibatches.
    queue = _queue()
    queue.add_epoch(0)
    task = queue.next_for(worker_id=7)
    assert queue.report(task.task_id, [10, 0, 10, 0]) == [0, 10]
    assert queue.done_count == 2


def test_checking_epochs_that_are_settled_and_held_whole_changes_and_journals_nothing():
    q = _queue()
    records = []
    q.record = records.append
    for epoch in range(3):
        q.add_epoch(epoch)
        while (task := q.next_for(0)) is not None:
            q.report(task.task_id, list(range(task.start, task.end, 10)))
            q.finish(task.task_id)
    held = {(e, s): set(range(0, n, 10)) for e in range(3) for s, n in enumerate((100, 30))}
    before = len(records)
    assert q.hold_only(held, 2, "rolled back") == []
    assert len(records) == before  # (a job of many epochs would journal every one, each time)
    del held[(1, 0)]
    assert q.hold_only(held, 2, "rolled back") == [(1, 0, list(range(0, 100, 10)))]
    assert [r["op"] for r in records[before:]] == ["settle"]


def _train_epoch(queue, epoch):
    queue.add_epoch(epoch)
    while (task := queue.next_for(1)) is not None:
        queue.report(task.task_id, list(range(task.start, task.end, queue.batch)))
        queue.finish(task.task_id)


def test_whole_epochs_share_one_done_set_per_source_and_a_requeue_copies_it():
    # A job of many epochs keeps one set per source for its whole epochs, not one each
    # (issue 39: the master's state, and its snapshot, do not grow with the epochs).
    queue = _queue()
    for epoch in range(3):
        _train_epoch(queue, epoch)
    assert queue.done[(0, 0)] is queue.done[(2, 0)] and queue.done[(0, 1)] is queue.done[(1, 1)]
    assert queue.done_count == 3 * (10 + 3)
    # Work of epoch 1 lost (a PS rolled back): queued again, epochs 0 and 2 untouched.
    queue.requeue_batches(1, 0, [20, 30], "rolled back")
    assert sorted(queue.done[(1, 0)]) == [0, 10, 40, 50, 60, 70, 80, 90]
    assert len(queue.done[(0, 0)]) == len(queue.done[(2, 0)]) == 10
    redo = queue.next_for(1)
    queue.report(redo.task_id, [20, 30])
    assert queue.done[(1, 0)] is queue.done[(0, 0)] and queue.done_count == 39


def test_what_the_coordinator_asks_each_turn_matches_a_pass_over_the_tasks():
    # training_pending, pending and records_done are kept as counts (the coordinator asks
    # them every turn; a pass over an epoch of 100,000 tasks took half the master's time
    # under many workers): after every kind of change they say what a pass would.
    import random

    from elasticdl_nb.runtime.master.tasks import EVALUATION, EXPORT

    rng = random.Random(3)
    queue = TaskQueue(
        [SourceInfo("/d/0", "csv", 95), SourceInfo("/d/1", "csv", 31)],
        [SourceInfo("/v", "csv", 40)], 10, 2, True, seed=7,
    )  # fmt: skip
    held: dict[int, int] = {}  # task id -> worker
    for step in range(400):
        op = rng.choice(["epoch", "eval", "next", "next", "report", "finish", "lose", "requeue"])
        if op == "epoch" and step % 60 == 0:
            queue.add_epoch(step // 60)
        elif op == "eval" and step % 90 == 0:
            queue.add_evaluation(step)
        elif op == "next" and (task := queue.next_for(rng.randrange(3))) is not None:
            held[task.task_id] = queue.doing[task.task_id].worker_id
        elif op in ("report", "finish") and held:
            task = queue.doing[rng.choice(list(held))].task
            queue.report(task.task_id, list(range(task.start, task.end, 10)))
            if op == "finish":
                queue.finish(task.task_id)
                held.pop(task.task_id)
        elif op == "lose" and held:
            worker = held[rng.choice(list(held))]
            queue.release_worker(worker)
            held = {t: w for t, w in held.items() if w != worker}
        elif op == "requeue" and queue.done:
            epoch, source = rng.choice(list(queue.done))
            if queue.done[(epoch, source)]:
                queue.requeue_batches(epoch, source, [min(queue.done[(epoch, source)])], "x")
        tasks = list(queue.todo) + [a.task for a in queue.doing.values()]
        for epoch in range(8):
            assert queue.training_pending(epoch) == any(
                t.kind == TRAINING and t.epoch == epoch for t in tasks
            )
            assert queue.records_done(epoch) == sum(
                min(10, queue.train[i].num_records - s)
                for i in range(2)
                for s in queue.done.get((epoch, i), ())
            )
        for kind in (TRAINING, EVALUATION, EXPORT):
            assert queue.pending(kind) == any(t.kind == kind for t in tasks)
    queue.stop_training()  # (the queued ones go; those handed out run on)
    assert queue.training_pending() == any(a.task.kind == TRAINING for a in queue.doing.values())
    assert not [t for t in queue.todo if t.kind == TRAINING]
