"""How far a job is: the fields of `progress` and `job_state` events and of the status,
the numbering of reported losses, and the training throughput of the last 10 seconds."""

from __future__ import annotations

import time
from collections import deque

from elasticdl_nb.runtime.master.tasks import TaskQueue

WINDOW_SECONDS = 10.0


class Progress:
    """Guarded by the master's lock, like the queue it reads."""

    STATE = ("loss_points",)  # (the window is this process's: a new master starts it empty)

    def __init__(self, queue: TaskQueue, epochs: int, minibatch_size: int):
        self._queue, self._epochs, self._batch = queue, epochs, minibatch_size
        self.records_per_epoch = sum(s.num_records for s in queue.train)
        self.loss_points = 0  # training losses reported (a redone minibatch reports again)
        self._window: deque[tuple[float, int]] = deque()  # (when, records) applied
        self._in_window = 0  # the records of the window's entries after its first
        # (a sum kept, not taken: at a thousand workers the window holds thousands of
        # entries, and each task's end asks for the rate)

    def applied(self, minibatches: int) -> None:
        """Minibatches newly counted done: they make the throughput."""
        if self._window:
            self._in_window += minibatches * self._batch
        self._window.append((time.monotonic(), minibatches * self._batch))

    def number_losses(self, count: int) -> int:
        """Numbers for `count` new loss points; returns the first."""
        first = self.loss_points + 1
        self.loss_points += count
        return first

    def fields(self, epoch: int) -> dict:
        """The progress fields of events and status, for the current `epoch` (-1: none)."""
        now = time.monotonic()
        window = self._window
        while window and now - window[0][0] > WINDOW_SECONDS:
            window.popleft()  # (the new first entry's records leave the sum)
            self._in_window = self._in_window - window[0][1] if window else 0
        span = now - window[0][0] if len(window) > 1 else 0
        rate = self._in_window / span if span > 0 else 0.0
        epoch = max(epoch, 0)
        return {
            "epoch": epoch,
            "epochs": self._epochs,
            "step": self._queue.done_count,
            "records_done": self._queue.records_done(epoch),
            "records_per_epoch": self.records_per_epoch,
            "records_per_second": round(rate, 1),
        }
