"""The coordinator: the one thread of the master that moves the job on.

RPC handlers (`task_desk.py`) only record what workers tell and wake it; each turn, it
decides what needs a round trip or a look at the whole job: start the first epoch once
the callbacks are loaded, check through the strategy that every minibatch of an epoch is
really applied before the epoch counts as done (`reconcile`), then start the next epoch
or go through the phases (`phases.py`) to the final evaluation, the export and the final
checkpoint, and end the job `succeeded`. It wakes when told (`wake`) and at least every
half second.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.tasks import EVALUATION, EXPORT, PREDICTION
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind, JobState, Phase

if TYPE_CHECKING:
    from elasticdl_nb.runtime.master.job_master import JobMaster

log = logging.getLogger("elasticdl_nb.master")


class Coordinator:
    """Drives `job` from its thread (`run`). It takes the job's lock for its decisions,
    and lets go of it for the strategy's round trips (`reconcile`, `final_checkpoint`,
    `observe`), which take it themselves."""

    def __init__(self, job: JobMaster):
        self._job = job
        self._wake = threading.Event()
        self._steps_seen = -1  # the step the callbacks last heard of

    def wake(self) -> None:
        """Something may be there to decide: take a turn now."""
        self._wake.set()

    def run(self) -> None:
        """Drive the job until it ends. (A master that took the job over from one that
        died goes on where that one was: `recovery.py`.)"""
        job = self._job
        if job.decisions.callbacks:
            job.decisions.callbacks.start()
        with job.lock:
            if not job.incarnation:
                job.journal.append(
                    EventKind.JOB_STATE,
                    state=JobState.RUNNING,
                    reason="started",
                    keras=job.spec.keras_version,
                    **job.progress_fields(),
                )
        while not job.finished.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            try:
                self._turn()
                job.strategy.observe()
            except Exception as exc:  # a bug here must end the job visibly, not hang it
                log.exception("coordinator failed")
                job.fail(f"master error: {exc!r}")

    def _turn(self) -> None:
        job = self._job
        with job.lock, job.journal.transaction():
            if job.saturation and job.state not in MASTER_END_STATES:
                job.saturation.check()  # (before judging silences: it may excuse them)
            if job.state in MASTER_END_STATES or not job.strategy.ready_to_train():
                return
            job.strategy.tick()
            if job.strategy.gives_up_on_silent_workers:
                self._give_up_on_silent_workers()
            if job.growth:
                job.growth.tick(training=job.phase == Phase.TRAINING)
            if job.epoch < 0:
                self._first_epoch()
                return
            self._steps_to_callbacks()
            last_epoch = job.epoch
            reconcile = job.strategy.reconcile_needed() or (
                job.phase == Phase.TRAINING and not job.queue.training_pending()
            )
        if reconcile and not job.strategy.reconcile(last_epoch):
            return
        job.evaluations.publish_finished()
        with job.lock, job.journal.transaction():  # (an epoch's tasks and its event)
            if job.state in MASTER_END_STATES or job.queue.training_pending():
                return
            if not self._move_on():
                return
        self._finish()

    def _give_up_on_silent_workers(self) -> None:
        """A worker that holds a task and said nothing for too long (worker_silence.py):
        its work goes back to the queue, and it is ended and replaced."""
        job = self._job
        for worker_id, silent in job.silence.overdue(job.queue.holders()):
            log.warning("worker %d silent for %.0f s with a task: given up on", worker_id, silent)
            job.journal.append(
                EventKind.PEER_UNREACHABLE,
                by="master",
                peer=f"worker-{worker_id}",
                seconds=round(silent, 3),
                times=1,
                healed=False,
                detail=(
                    f"no report or task request for {silent:.0f} s while it held a task: "
                    "its work goes back to the queue, and it is ended and replaced"
                ),
            )
            job.release(worker_id)
            job.silence.forget(worker_id)
            job.end_worker(worker_id)

    def _first_epoch(self) -> None:
        callbacks = self._job.decisions.callbacks
        if callbacks and not callbacks.loaded.is_set():
            return  # (the first epoch starts once they are loaded)
        self._job.decisions.call(lambda c: c.epoch_begin(0))
        self._job.start_epoch(0)

    def _steps_to_callbacks(self) -> None:
        """Tell the callbacks how many steps are applied, when that changed in training."""
        job = self._job
        callbacks = job.decisions.callbacks
        if (
            callbacks
            and callbacks.loaded.is_set()  # (a new master: not held up by loading)
            and job.phase == Phase.TRAINING
            and job.step != self._steps_seen
        ):
            self._steps_seen = job.step
            job.decisions.call(lambda c: c.steps_done(job.step))

    def _move_on(self) -> bool:
        """With no training pending (under the lock): move the job on from its phase once
        that phase's work is done. True when what is left is the final checkpoint."""
        job = self._job
        if job.phase == Phase.TRAINING and not self._epoch_trained():
            return False
        if job.phase == Phase.EVALUATING:
            if job.queue.pending(EVALUATION) or job.evaluations.open:
                return False
            if job.queue.prediction:
                job.phases.move(Phase.PREDICTING)
                job.queue.add_prediction(str(JobDir(job.job_dir).predictions))
            else:
                self._export()
            job.work_changed()
            return False
        if job.phase == Phase.PREDICTING:
            if job.queue.pending(PREDICTION):
                return False
            job.journal.append(
                EventKind.PREDICTIONS,
                path=str(JobDir(job.job_dir).predictions),
                records=sum(source.num_records for source in job.queue.prediction),
            )
            self._export()
            job.work_changed()
            return False
        if job.phase == Phase.EXPORTING:
            if job.queue.pending(EXPORT):
                return False
            job.phases.move(Phase.FINISHING)
        return True

    def _export(self) -> None:
        self._job.phases.move(Phase.EXPORTING)
        self._job.queue.add_export(self._job.export_path, self._saved_model_path())

    def _epoch_trained(self) -> bool:
        """The current epoch's training is applied: its end (evaluated first, if it is
        evaluated at epoch ends), then the next epoch (False), or, after the last one or
        a callback's stop, the final evaluation (True)."""
        job = self._job
        decisions = job.decisions
        if decisions.callbacks:
            decisions.callbacks.epoch_trained(job.epoch)
        if job.spec.evaluation_steps == 0 and job.validation:
            # (the epoch's end is called back once this round is in: CallbackDecisions.evaluated)
            last = job.epoch == job.spec.epochs - 1 or bool(decisions.stop_reason)
            job.start_evaluation(final=last, epoch=job.epoch)
        else:
            # (evaluating every N steps: the newest round's metrics)
            decisions.call(lambda c: c.epoch_end(job.epoch, self._newest_metrics()))
        if job.epoch + 1 < job.spec.epochs and not decisions.stop_reason:
            decisions.call(lambda c: c.epoch_begin(job.epoch + 1))
            job.start_epoch(job.epoch + 1)
            return False
        job.phases.move(Phase.EVALUATING)
        if job.validation and not job.evaluations.final_started:
            job.start_evaluation(final=True)
        return True

    def _newest_metrics(self) -> dict:
        """The newest evaluation's metrics, by name (none before the first)."""
        return {k: v for k, v in self._job.evaluations.last_metrics.items() if k != "step"}

    def _saved_model_path(self) -> str:
        """Where the export writes a SavedModel: export_format's, or where ElasticDL's
        `SavedModelExporter` callback asks ("" = none)."""
        job = self._job
        callbacks = job.decisions.callbacks
        exporters = callbacks.of_type("SavedModelExporter") if callbacks else []
        if exporters:
            return exporters[-1].export_dir or str(JobDir(job.job_dir).saved_model)
        return job.saved_model_path

    def _finish(self) -> None:
        """The final checkpoint, then `succeeded`; back to training if a PS lost work."""
        job = self._job
        versions = job.strategy.final_checkpoint()
        if versions is None:  # not now: what was lost is found and redone in training
            with job.lock:
                job.phases.move(Phase.TRAINING)
            return
        if not job.strategy.reconcile(job.epoch):
            return
        job.strategy.observe(final=True)  # (round trips to the PS: outside the lock)
        with job.lock:
            if job.state in MASTER_END_STATES:  # stopped or failed while checkpointing
                return
            if job.queue.training_pending():  # a PS lost work at the very end: redo it
                job.phases.move(Phase.TRAINING)
                return
            with job.journal.transaction():  # (the end and the callbacks' end: together)
                if versions:
                    job.journal.append(EventKind.CHECKPOINT, versions=versions, final=True)
                job.decisions.call(lambda c: c.train_end(self._newest_metrics()))
                if job.state in MASTER_END_STATES:  # (a callback failed)
                    return
                job.phases.move(Phase.DONE)
                job.end(JobState.SUCCEEDED, job.decisions.stop_reason or "all epochs done")
