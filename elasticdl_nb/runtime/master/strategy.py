"""The seam between the job and how it trains: `TrainingStrategy`, and `JobControl`, what
a strategy may ask of the job.

`JobMaster` keeps what every job has (tasks, epochs, evaluation rounds, progress, the
job's state and phase) and asks its strategy whatever depends on how gradients are
applied. Two strategies implement it:

- `ps_strategy.PsStrategy`: parameter servers hold the model; workers push gradients
  to them. The PS are the record of what was applied: the master asks them
  (`GetApplied`) before an epoch counts as done, and redoes what a restored PS lost.
- `allreduce_group.AllreduceGroup`: workers hold replicas and reduce among themselves;
  the master keeps who is in the group, and the members' reports are the record.

Who calls whom: the master calls its strategy (under the master's lock, except
`reconcile`, `final_checkpoint` and `observe`, which make round trips to the PS and take
the lock themselves); a strategy calls back only through `JobControl`. The gRPC service calls a
strategy's own RPCs (PS: `ps_ready`; allreduce: `join`, `get`, `report_lost`) directly.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.tasks import TaskQueue
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb


class JobControl(Protocol):
    """What a strategy may use of the job (`JobMaster` provides it)."""

    lock: threading.RLock  # the master's: it guards the queue and the strategy's state
    queue: TaskQueue
    journal: Journal
    job_dir: Path
    epoch: int  # the newest epoch started (-1: none yet)

    def release(self, worker_id: int) -> None:
        """Give a lost worker's unreported work back to the queue."""

    def fail(self, message: str) -> None:
        """End the job as failed with this message."""

    def end_worker(self, worker_id: int) -> None:
        """Kill a worker process (it is replaced like any worker that died): from a
        thread of its own, so it returns at once and a failed kill does not fail the job."""

    def wake(self) -> None:
        """The coordinator has something to decide."""

    def work_changed(self) -> None:
        """Tasks were queued: wake the GetTask calls waiting for work."""


class TrainingStrategy(Protocol):
    """What the job asks of the way it trains. Attributes are fixed per strategy."""

    # Whether a worker that holds a task and asks for work must first send the push it
    # sends with its next pull (PS: its last minibatch may end the epoch) before it gets
    # more work.
    pushes_before_more_work: bool
    # How long a worker that got no task waits before it asks again.
    idle_wait_seconds: float
    # Whether a worker the master no longer wants is told to stop in its progress reply
    # (an allreduce member is not: it leaves with the group at an agreed step).
    stops_unwanted_on_report: bool
    # Whether training waits while fewer workers than a range's MIN run (worker_floor.py).
    holds_below_floor: bool
    # Whether a worker that holds a task and falls silent is given up on
    # (worker_silence.py); allreduce members have step deadlines instead.
    gives_up_on_silent_workers: bool

    def ready_to_train(self) -> bool:
        """Whether the coordinator may start and judge epochs (PS: every PS came up)."""
        ...

    def task_for_unwanted(self, worker_id: int) -> pb.Task:
        """What a worker that may not take work (retiring, or ended) gets for GetTask."""
        ...

    def worker_reported(self, report: pb.ProgressReport) -> None:
        """What the strategy learns from a progress report, besides the job's progress."""
        ...

    def worker_lost(self, worker_id: int) -> bool:
        """A worker process ended: whether its tasks may be released now (else the
        strategy releases them through `JobControl.release` when it knows what to keep)."""
        ...

    def ps_lost(self, ps_id: int) -> None:
        """A parameter server ended (and is being relaunched)."""
        ...

    def tick(self) -> None:
        """The coordinator's turn (every wake-up, at least every 0.5 s), under the lock."""
        ...

    def observe(self, final: bool = False) -> None:
        """Outside the lock, after each coordinator turn: journal what the strategy's
        peers report about themselves (PS: their tables), at most every few seconds, or
        now if `final` (before the job's end is recorded)."""
        ...

    def reconcile_needed(self) -> bool:
        """Whether what was counted done must be checked against what is applied now,
        whatever the phase (a PS came back from a checkpoint)."""
        ...

    def reconcile(self, last_epoch: int) -> bool:
        """Make the queue's record of done minibatches (epochs up to `last_epoch`) what is
        really applied, queueing again what is not. Returns False when it cannot tell
        yet (a PS is down); the coordinator then asks again later."""
        ...

    def final_checkpoint(self) -> list[int] | None:
        """Save the trained model's state where the strategy keeps it: the versions
        saved (empty: nothing to save), or None when it cannot now and what was lost
        must be trained again."""
        ...

    def status_fields(self) -> dict:
        """What the strategy adds to the job's status."""
        ...

    def held_still(self) -> AbstractContextManager:
        """While held (with the job's lock), the strategy's state does not change: what a
        master's snapshot takes (snapshot.py). Its own lock, if it has one besides the
        job's."""
        ...

    def replay(self, kind: str, data: dict) -> None:
        """A journal event of an earlier master of this job: set the strategy's state as
        that event left it, and do nothing else (`recovery.py`)."""
        ...

    def resumed(self) -> None:
        """The journal is replayed and the master serves: check what the strategy holds
        against its peers as they are now."""
        ...
