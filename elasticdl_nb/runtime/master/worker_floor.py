"""The worker floor: whether enough workers run for the job to train (a worker range's MIN).

A job with `workers="2:6"` trains once two workers run, and when fewer run again (their
pods preempted by a higher priority, evicted, or not scheduled yet) it waits for them
rather than fail; the journal says when it starts and stops waiting (`worker_floor`
events), so the dashboard can say why nothing moves.

A worker counts as running from its first GetTask (it has imported TensorFlow, built
the model and reached the master: a pod that is Running may still be starting) until the
instance manager hears of its end or retires it.

What the floor holds back depends on the strategy (`TrainingStrategy.holds_below_floor`):
- PS: no training tasks are handed out below MIN. The workers that run would make
  progress, but MIN is the user's statement of the fewest worth training with (the
  asynchronous updates' staleness, the throughput each worker's PS share pays for).
- allreduce: the group goes on with the members it has. Its first version forms once
  MIN have joined (`GroupCoordinator.expected`); after a loss the survivors hold the
  model replicas and the step they agreed on: stopping them would keep the memory and
  drop the progress, and joiners come into the running group in place. The floor is
  journaled all the same.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticdl_nb.vocabulary import EventKind


class WorkerFloor:
    """Guarded by the master's lock. The MIN is the instance manager's (the spec's, then
    each `scale`'s, replayed by a master that takes over); 0: a fixed number of workers,
    which trains with any that run (nothing is journaled)."""

    def __init__(
        self,
        journal_append: Callable[..., None],
        takes_work: Callable[[int], bool],
        minimum: Callable[[], int],
        holds: bool = True,
    ):
        self._append = journal_append
        self._takes_work = takes_work  # (the instance manager's: known, not retiring, live)
        self._minimum = minimum
        self.holds = holds
        self._running: set[int] = set()
        self._below: bool | None = None  # as last journaled (None: not yet)

    def running(self) -> int:
        self._running = {w for w in self._running if self._takes_work(w)}
        return len(self._running)

    def asked(self, worker_id: int) -> None:
        """A worker asked for work: it runs."""
        if worker_id not in self._running:
            self._running.add(worker_id)
            self.check()

    def lost(self, worker_id: int) -> None:
        self._running.discard(worker_id)
        self.check()

    @property
    def minimum(self) -> int:
        return self._minimum()

    def below(self) -> bool:
        minimum = self.minimum
        return bool(minimum) and self.running() < minimum

    def held(self) -> bool:
        """Whether training tasks are held back now."""
        return self.holds and self.below()

    def check(self) -> None:
        """Journal the floor when the job goes below it or back above it."""
        below, before = self.below(), self._below
        self._below = below
        if below == before or (before is None and not below):
            return  # no change (a job that starts with enough has nothing to say)
        self._append(
            EventKind.WORKER_FLOOR,
            running=self.running(),
            min=self.minimum,
            below=below,
            held=below and self.holds,
        )
