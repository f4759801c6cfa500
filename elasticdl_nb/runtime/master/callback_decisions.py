"""What the model's callbacks decided for the job, and the master acting on it.

The callbacks themselves (`callbacks.py`) are called at the job's points by the
coordinator and the evaluator thread; what a round of calls decides (`Decisions`) is
applied here: a new learning rate, which every training task handed out from then on
carries (`learning_rate`, `learning_rate_set`), or a stop, which drops the training
still queued (`stop_reason`). Both are journaled, and a master that takes the job over
sets them again from those events (`replay`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from elasticdl_nb.runtime.master.callbacks import (
    CallbackError,
    Decisions,
    JobCallbacks,
    callbacks_for,
)
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind

if TYPE_CHECKING:
    from elasticdl_nb.runtime.master.job_master import JobMaster


class CallbackDecisions:
    """The job's callbacks (`callbacks`, None when the model has none) and what they
    decided. Guarded by the job's lock."""

    # `calls`: every journaled call of the callbacks, which a new master makes again.
    STATE = ("learning_rate", "learning_rate_set", "stop_reason", "calls")

    def __init__(self, job: JobMaster, bundle: Path, load_contract: Callable[[], object]):
        self._job = job
        # (loaded on `callbacks.start()`; every call but the per-step one is journaled)
        self.callbacks = callbacks_for(bundle, load_contract, self._journal_call)
        self.calls: list[tuple[str, list, dict]] = []  # (hook, args, logs) as journaled
        self.learning_rate = 0.0  # set by a callback (0: the optimizer's own)
        self.learning_rate_set = 0  # how many times one was set
        self.stop_reason = ""  # why a callback stopped training ("" = it did not)

    def _journal_call(self, hook: str, args: list, logs: dict) -> None:
        self._job.journal.append(EventKind.CALLBACK, hook=hook, args=args, logs=logs)
        self.calls.append((hook, args, logs))

    def call(self, call: Callable[[JobCallbacks], Decisions]) -> None:
        """Call the callbacks (`call(callbacks)` -> Decisions) and act on what they
        decided; a callback that fails fails the job. Under the lock, in one journal
        transaction: the calls are journaled, and from every thread in one order."""
        if not self.callbacks:
            return
        job = self._job
        with job.lock, job.journal.transaction():
            try:
                decided = call(self.callbacks)
            except CallbackError as exc:
                job.fail(f"callback failed: {exc}")
                return
            self._act(decided)

    def _act(self, decided: Decisions) -> None:
        job = self._job
        if decided.learning_rate is not None and decided.learning_rate != self.learning_rate:
            self.learning_rate = decided.learning_rate
            self.learning_rate_set += 1
            job.journal.append(
                EventKind.LEARNING_RATE,
                rate=self.learning_rate,
                set=self.learning_rate_set,
                by=decided.set_by,
                epoch=job.epoch,
                step=job.step,
            )
        if decided.stop and not self.stop_reason and job.state not in MASTER_END_STATES:
            self.stop_reason = decided.stop
            dropped = job.queue.stop_training()
            job.journal.append(
                EventKind.TRAINING_STOPPED,
                reason=decided.stop,
                epoch=job.epoch,
                step=job.step,
                dropped=dropped,
            )
            job.wake()

    def evaluated(self, metrics: dict, epoch: int | None) -> None:
        """An evaluation round is in (the evaluator thread, under the lock, with the
        round's event): the callbacks' test end, and the end of the epoch that waited."""
        self.call(lambda c: c.test_end(metrics))
        if epoch is not None:
            self.call(lambda c: c.epoch_end(epoch, metrics))

    def replay(self, kind: str, data: dict) -> None:
        """What an earlier master of this job journaled the callbacks decided."""
        if kind == EventKind.LEARNING_RATE:
            self.learning_rate, self.learning_rate_set = data["rate"], data["set"]
        elif kind == EventKind.TRAINING_STOPPED:
            self.stop_reason = data["reason"]
        elif kind == EventKind.CALLBACK:
            self.calls.append((data["hook"], data["args"], data["logs"]))

    def replay_calls(self) -> None:
        """After `replay` (and a snapshot's `calls`): call the new callbacks as the
        journal says the earlier ones were called, so that their state is what it was
        (what they decided is not decided again)."""
        if self.callbacks:
            self.callbacks.replay(self.calls, bool(self.stop_reason), self.learning_rate)
