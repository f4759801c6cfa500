"""GetTask with no work waits for some on a thread of the master's server: at most
WAITING_ASKS calls wait at once, and the others are told at once to ask again later
(runtime/master/task_desk.py), so that an epoch's end under many workers leaves threads
for the reports that end it."""

from __future__ import annotations

import threading
import time

from elasticdl_nb.runtime.master.task_desk import ASK_AGAIN_S, WAITING_ASKS
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from tests.unit.masters import started_master


def test_at_most_waiting_asks_wait_and_the_rest_are_told_to_ask_again(tmp_path):
    workers = WAITING_ASKS + 24
    master = started_master(tmp_path, workers=workers)  # (no epoch started: no work)
    answers: dict[int, tuple[float, pb.Task]] = {}
    go = threading.Barrier(workers)

    def ask(worker_id):
        go.wait()
        began = time.monotonic()
        task = master.get_task(worker_id, seq=1, wait_seconds=2.0)
        answers[worker_id] = (time.monotonic() - began, task)

    threads = [threading.Thread(target=ask, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(task.type == pb.NONE for _, task in answers.values())
    told = [s for s, task in answers.values() if task.wait_seconds == ASK_AGAIN_S]
    waited = [s for s, task in answers.values() if task.wait_seconds != ASK_AGAIN_S]
    assert len(waited) == WAITING_ASKS and len(told) == workers - WAITING_ASKS
    assert min(waited) >= 1.9 and max(told) < 1.0  # (the told ones did not wait)


def test_a_waiting_ask_gets_the_work_that_comes(tmp_path):
    master = started_master(tmp_path, workers=2)
    got = []
    asker = threading.Thread(target=lambda: got.append(master.get_task(0, 1, 5.0)))
    asker.start()
    time.sleep(0.3)
    with master.lock:
        master.start_epoch(0)
    asker.join()
    assert got[0].type == pb.TRAINING
