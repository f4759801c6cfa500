"""Tasks fetched ahead, on a background thread: an allreduce member must never keep the
group waiting on a GetTask round trip (the master long-polls up to a second when it has
no work), so the next task is already here when the current one ends.

`next()` never blocks: a task, or None (nothing yet: the member contributes an empty
minibatch this step). `finished` turns true once the master says the job is over.

`TaskRequests` numbers a worker's GetTask calls (every worker asks through it): a call
retried after a lost reply gets the same task, never a second one.
"""

from __future__ import annotations

import logging
import queue
import threading

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc

log = logging.getLogger("elasticdl_nb.worker")

# The master long-polls for at most a second: a reply later than this is a master that is
# paused or overloaded, and the call is retried (with the same number).
GET_TASK_TIMEOUT = 10.0


class TaskRequests:
    """A worker's numbered GetTask calls."""

    def __init__(self, master: rpc.MasterStub, worker_id: int):
        self._master, self._worker_id = master, worker_id
        self._seq = 0

    def next(self) -> pb.Task:
        self._seq += 1
        request = pb.GetTaskRequest(worker_id=self._worker_id, seq=self._seq)
        return self._master.GetTask(request, timeout=GET_TASK_TIMEOUT)


class TaskFeed:
    def __init__(self, master: rpc.MasterStub, worker_id: int, ahead: int = 1):
        self._requests = TaskRequests(master, worker_id)
        self._tasks: queue.Queue[pb.Task] = queue.Queue(maxsize=ahead)
        self.finished = threading.Event()
        self._closed = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="task-feed")
        self._thread.start()

    def next(self) -> pb.Task | None:
        try:
            return self._tasks.get_nowait()
        except queue.Empty:
            if self.error is not None:
                raise self.error from None
            return None

    def close(self) -> None:
        self._closed.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                task = self._requests.next()  # (transient failures are retried inside)
            except Exception as exc:  # the master is gone, or not ours: next() says so
                self.error = exc
                return
            if task.type == pb.FINISHED:
                self.finished.set()
                return
            if task.type == pb.NONE:  # (the master long-polls; it says when to wait more)
                self._closed.wait(task.wait_seconds)
                continue
            while not self._closed.is_set():  # hold it until there is room
                try:
                    self._tasks.put(task, timeout=0.2)
                    break
                except queue.Full:
                    continue
