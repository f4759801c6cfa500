"""Workers that hold a task and stop talking to the master: cut off from it, frozen, or on
a node that stopped answering. Their tasks must not wait for them.

Every worker talks to the master at least every few seconds (its reporter sends an
empty report when it has nothing else to say, `worker/reporter.py` HEARTBEAT_SECONDS,
from a thread of its own: a worker that waits for a PS, or computes a long step, still
talks). A worker that holds a task and has said nothing for `SILENCE_SECONDS` is given
up on (the coordinator's turn, `coordinator.py`): the journal says so (`peer_unreachable`
by the master, peer "worker-N", not healed), its unreported minibatches go back to the
queue for the others, and it is ended and replaced like a worker that died. A minibatch
it still pushes meanwhile is applied once all the same: a PS takes each minibatch once,
whoever pushes it.

The budget: a cut-off worker's tasks go to the others within SILENCE_SECONDS and one
coordinator turn (half a second) of its last word. A master that cannot keep up with its
workers (saturation.py) excuses every silence while it is behind: a worker's call may be
waiting in its queue, or have been turned away, and silence counts again from then. The
allreduce strategy does not use this: its members' step deadlines find one that stops
(`collective/`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

SILENCE_SECONDS = 30.0


class WorkerSilence:
    """When each worker last spoke (a GetTask or a report), by the master's clock."""

    def __init__(
        self, seconds: float = SILENCE_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self.seconds, self._clock = seconds, clock
        self._heard: dict[int, float] = {}
        self._excused = float("-inf")  # no silence before this counts

    def heard(self, worker_id: int) -> None:
        self._heard[worker_id] = self._clock()

    def excuse(self) -> None:
        """Every worker's silence so far is the master's doing (it is behind): count
        silence from now."""
        self._excused = self._clock()

    def overdue(self, holders: Iterable[int]) -> list[tuple[int, float]]:
        """Of the workers that hold a task, those silent for longer than `seconds`, with
        how long. A holder not heard from yet (a master that took the job over) counts
        from now."""
        now = self._clock()
        late = []
        for worker_id in sorted(set(holders)):
            silent = now - max(self._heard.setdefault(worker_id, now), self._excused)
            if silent > self.seconds:
                late.append((worker_id, silent))
        return late

    def forget(self, worker_id: int) -> None:
        self._heard.pop(worker_id, None)
