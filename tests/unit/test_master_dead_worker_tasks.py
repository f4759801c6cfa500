"""A dead worker's GetTask that is still waiting in the master must not take a task.

Seen in CI: a worker SIGKILLed while its GetTask waited for work; the master recorded
the death, then queued an evaluation round, and the waiting call handed one of its tasks
to the dead worker. The round never completed and the job never ended. The real master
classes run here; only the launcher is a recording stand-in (no processes needed).
"""

from __future__ import annotations

import threading
import time

from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from tests.unit.masters import started_master


def test_a_waiting_get_task_of_a_worker_that_died_meanwhile_gets_no_task(tmp_path):
    master = started_master(tmp_path, workers=2, records=0)
    with master.lock:
        master.start_epoch(0)  # training has begun, with no task to hand out

    answer: list[pb.Task] = []
    waiting = threading.Thread(target=lambda: answer.append(master.get_task(1, wait_seconds=5)))
    waiting.start()
    time.sleep(0.2)  # worker 1's GetTask now waits for work
    master.instances.on_event(InstanceEvent("worker", 1, "killed", signal="SIGKILL"))
    with master.lock:
        master.start_evaluation(final=False)  # work appears: this wakes the waiting call
    waiting.join(5)

    assert answer and answer[0].type == pb.FINISHED
    # The round's tasks are all still there for the living workers.
    assert master.queue.doing == {}
    assert sum(t.kind == pb.EVALUATION for t in master.queue.todo) == 2
    assert master.get_task(0, wait_seconds=0).type == pb.EVALUATION
