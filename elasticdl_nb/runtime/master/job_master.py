"""The master's brain: one job over its tasks, epochs, evaluation rounds and instances.

RPC handlers only record what workers tell it and wake the coordinator thread; the
coordinator (`_coordinate`) makes every decision that needs a round trip, such as
checking through the strategy that every minibatch of an epoch is really applied before
the epoch counts as done. Whatever depends on how gradients are applied (parameter
servers or allreduce) is the strategy's (`strategy.TrainingStrategy`).

Phases (`phases.py`): training -> evaluating -> exporting -> finishing -> done, and
from finishing back to training when a PS lost work at the very end. A failure report, a
spent relaunch budget or an error in the master ends the job `failed`; `Stop`, `stopped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.callbacks import CallbackError, Decisions, callbacks_for
from elasticdl_nb.runtime.master.evaluation import Evaluations, metric_states
from elasticdl_nb.runtime.master.goodput import Goodput
from elasticdl_nb.runtime.master.instances import InstanceManager, LauncherFor
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.phases import Phases
from elasticdl_nb.runtime.master.progress import Progress
from elasticdl_nb.runtime.master.stragglers import Stragglers
from elasticdl_nb.runtime.master.strategy import JobControl, TrainingStrategy
from elasticdl_nb.runtime.master.tasks import EVALUATION, EXPORT, TRAINING, TaskQueue
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind, JobState, Phase, Role

log = logging.getLogger("elasticdl_nb.master")

# The phases in which the model is exported (its path is in the status).
_EXPORTED = (Phase.FINISHING, Phase.DONE)


class JobMaster:
    """One job's master: its task queue, epochs, evaluation rounds, progress, state and
    phase; its instances (`instances`, the elastic policy) and its training strategy
    (`strategy`). Made by `assembly.build_master`; `run` drives it on its own thread.

    Threading: `lock`, a re-entrant lock owned here, guards the queue, the job's state,
    the instance table (the `InstanceManager` is given it) and the strategy's state. Who
    calls whom:
    - gRPC threads (`service.MasterService`) call `get_task`, `report`, `scale`, `stop`,
      `status`, and the strategy's own RPCs;
    - the launcher's threads call `instances.on_event`, which calls back `worker_lost`,
      `strategy.ps_lost` and `fail`, under the lock;
    - the coordinator thread (`run`) calls the strategy's `reconcile` and
      `final_checkpoint` without holding the lock (they call the PS);
    - the evaluator thread turns finished evaluation rounds into metrics;
    - the strategy calls back only through `JobControl` (`release`, `fail`, `end_worker`,
      `wake`, `work_changed`).
    """

    def __init__(
        self,
        spec: JobSpec,
        journal: Journal,
        train: list[SourceInfo],
        validation: list[SourceInfo],
        job_dir: Path,
        *,
        strategy_for: Callable[[JobControl], TrainingStrategy],
        launcher_for: LauncherFor,
        load_contract: Callable[[], object],
    ):
        self.spec, self.journal, self.job_dir = spec, journal, job_dir
        self.name = spec.name or Path(job_dir).name
        self.lock = threading.RLock()
        self.queue = TaskQueue(
            train,
            validation,
            spec.minibatch_size,
            spec.minibatches_per_task,
            spec.shuffle,
            spec.seed,
        )
        # Every change to the queue is journaled before anyone hears of it (recovery.py).
        self.queue.record = lambda entry: journal.append(EventKind.QUEUE, **entry)
        self.validation = validation
        self.progress = Progress(self.queue, spec.epochs, spec.minibatch_size)
        self.goodput = Goodput(journal, spec.workers)  # folds of the journal (goodput.py,
        self.stragglers = Stragglers(journal, spec.strategy)  # stragglers.py)
        self.state, self.error = JobState.RUNNING, ""
        self.phases = Phases(journal.append)
        self.epoch = -1
        self.started = time.time()
        self.ended: float | None = None
        files, export = JobDir(job_dir), spec.export_format  # ("" below: not exported)
        self.export_path = str(files.model) if export != "saved_model" else ""
        self.saved_model_path = str(files.saved_model) if export != "keras" else ""
        self._wake = threading.Event()
        self._work = threading.Condition(self.lock)  # notified when tasks may be there
        self.finished = threading.Event()
        # Retried calls (see protocol/patience.py): per worker, the task its newest GetTask
        # was given, which GetTask call is the newest, and the newest report counted.
        self._task_given: dict[int, tuple[int, pb.Task]] = {}
        self._task_asking: dict[int, int] = {}
        self._asks = 0
        self._reports_counted: dict[int, int] = {}
        self.incarnation = 0  # how many masters of this job died before this one
        self.rebuilt: dict = {}  # what rebuilding from the journal took (recovery.py)
        self.evaluations = Evaluations(self, load_contract)
        self.evaluations.on_published = self._evaluated
        # The model's callbacks (callbacks.py) and what they decided.
        self.callbacks = callbacks_for(
            files.bundle,
            load_contract,
            lambda hook, args, logs: journal.append(
                EventKind.CALLBACK, hook=hook, args=args, logs=logs
            ),
        )
        self.learning_rate = 0.0  # set by a callback (0: the optimizer's own)
        self.learning_rate_set = 0  # how many times one was set
        self.stop_reason = ""  # why a callback stopped training ("" = it did not)
        self._steps_seen = -1
        self.strategy = strategy_for(self)
        self.instances = InstanceManager(
            launcher_for,
            journal,
            workers=spec.workers,
            ps=spec.parameter_servers,
            max_worker_relaunches=spec.max_worker_relaunches,
            max_ps_relaunches=spec.max_ps_relaunches,
            on_worker_lost=self.worker_lost,
            on_ps_lost=self.strategy.ps_lost,
            on_job_failed=self.fail,
            lock=self.lock,
            pending_timeout=spec.pending_timeout,
            log_tail=JobDir(job_dir).log_tail,
        )

    @property
    def phase(self) -> Phase:
        return self.phases.current

    @property
    def step(self) -> int:
        """Minibatches applied so far, each counted once."""
        return self.queue.done_count

    # ================================================================== RPC side

    def get_task(self, worker_id: int, seq: int = 0, wait_seconds: float = 1.0) -> pb.Task:
        """The next task for a worker. With none queued, wait up to `wait_seconds` for
        one (the coordinator may be about to start an epoch) instead of letting the
        worker sleep through it.

        A worker asks one request at a time, numbered by `seq`: a retry of a request
        whose reply was lost gets the task that request was given, and a call that a
        newer one overtook (its caller stopped waiting) gives nothing away."""
        deadline = time.monotonic() + wait_seconds
        with self.lock:
            given = self._task_given.get(worker_id)
            if seq and given is not None and given[0] == seq:
                return given[1]
            self._asks += 1
            ask = self._task_asking[worker_id] = self._asks
            self._work.notify_all()  # an older call of this worker that waits: it is over
            while True:
                if self._task_asking[worker_id] != ask:  # (its caller reads the newer one)
                    return pb.Task(type=pb.NONE, wait_seconds=0.0)
                if self.state in MASTER_END_STATES:
                    return pb.Task(type=pb.FINISHED)
                if not self.instances.takes_work(worker_id):
                    return self.strategy.task_for_unwanted(worker_id)
                task = None
                if self.epoch >= 0 and self.queue.todo:  # (an empty ask is not journaled)
                    task = self.queue.next_for(worker_id, tags={"seq": seq} if seq else None)
                if task is not None:
                    message = task.to_message()
                    if task.kind == TRAINING:
                        message.learning_rate = self.learning_rate
                        message.learning_rate_set = self.learning_rate_set
                    if seq:
                        self.remember_task_given(worker_id, seq, message)
                    return message
                if self.strategy.pushes_before_more_work and self.queue.holds(worker_id):
                    # It still holds a task whose last push it sends with its next pull:
                    # no more work now, so it sends that push first (and may end the epoch).
                    return pb.Task(type=pb.NONE, wait_seconds=0.05)
                self._wake.set()
                left = deadline - time.monotonic()
                if left <= 0:
                    return pb.Task(type=pb.NONE, wait_seconds=self.strategy.idle_wait_seconds)
                self._work.wait(left)

    def report(self, r: pb.ProgressReport) -> pb.ProgressResponse:
        # One transaction: a master killed between journaling a report and the end of its
        # task left a new one waiting forever for a task whose every minibatch was
        # reported (the worker's retry was "counted already").
        with self.lock, self.journal.transaction():
            if r.seq and r.seq <= self._reports_counted.get(r.worker_id, 0):
                return self._progress_response(r.worker_id)  # a retry: counted already
            if r.seq:
                self.remember_report_counted(r.worker_id, r.seq)
            if r.error:
                where = "user code" if r.error_is_user_code else "the worker"
                self._fail(f"worker {r.worker_id} failed in {where}:\n{r.error}")
                return pb.ProgressResponse(stop=True)
            fresh = self.queue.report(
                r.task_id, list(r.batch_starts), tags={"worker": r.worker_id, "seq": r.seq}
            )
            if fresh:
                self._count_progress(fresh)
            if r.losses:
                if self.callbacks:
                    self.callbacks.losses([p.loss for p in r.losses])
                first = self.progress.number_losses(len(r.losses))
                rates = [[first + i, p.learning_rate] for i, p in enumerate(r.losses)]
                self.journal.append(
                    EventKind.LOSS,
                    worker=r.worker_id,
                    points=[[first + i, round(float(p.loss), 6)] for i, p in enumerate(r.losses)],
                    **({"learning_rates": rates} if any(p.learning_rate for p in r.losses) else {}),
                )
            if r.task_done:
                self._task_done(r)
            self.strategy.worker_reported(r)
            self._wake.set()
            return self._progress_response(r.worker_id)

    def remember_task_given(self, worker_id: int, seq: int, task: pb.Task) -> None:
        """The task a worker's GetTask number `seq` got: a retry of it gets the same."""
        self._task_given[worker_id] = (seq, task)

    def remember_report_counted(self, worker_id: int, seq: int) -> None:
        """A worker's report number `seq` is counted: a retry of it is not counted again."""
        self._reports_counted[worker_id] = seq

    def _progress_response(self, worker_id: int) -> pb.ProgressResponse:
        stop = self.state in MASTER_END_STATES or (
            self.strategy.stops_unwanted_on_report and not self.instances.takes_work(worker_id)
        )
        return pb.ProgressResponse(stop=stop)

    def _count_progress(self, fresh: list[int]) -> None:
        before = self.step - len(fresh)
        every = self.spec.evaluation_steps
        if every and self.validation and before // every != self.step // every:
            self.start_evaluation(final=False)
        self.progress.applied(len(fresh))

    def _task_done(self, r: pb.ProgressReport) -> None:
        assignment = self.queue.finish(r.task_id)
        if assignment is None:
            return
        task = assignment.task
        if task.kind == TRAINING:
            if r.HasField("timing"):
                t = r.timing
                self.journal.append(
                    EventKind.WORKER_TIME,
                    worker=r.worker_id,
                    task=r.task_id,
                    minibatches=t.minibatches,
                    task_s=round(t.task_seconds, 6),
                    compute_s=round(t.compute_seconds, 6),
                    wait_s=round(t.wait_seconds, 6),
                    **({"stale": t.stale} if t.stale else {}),
                )
                self.stragglers.check()
            self.journal.append(EventKind.PROGRESS, **self._progress())
        elif task.kind == EVALUATION:
            self.evaluations.add(task.eval_round, r.worker_id, metric_states(r.metric_states))
        elif task.kind == EXPORT:
            if r.exported_tables:  # (too large for a Keras file)
                self.journal.append(
                    EventKind.EXPORT, path=r.exported_tables, worker=r.worker_id, tables=True
                )
            else:
                saved = {"saved_model": task.saved_model_path} if task.saved_model_path else {}
                self.journal.append(
                    EventKind.EXPORT, path=task.export_path, worker=r.worker_id, **saved
                )

    def scale(self, workers: int) -> dict:
        if workers < 1:
            raise ValueError("workers must be at least 1; stop the job to end it")
        with self.lock:
            if self.state in MASTER_END_STATES:
                raise ValueError(f"the job is {self.state}")
            return self.instances.scale(workers)

    def stop(self, reason: str) -> None:
        with self.lock:
            if self.state not in MASTER_END_STATES:
                self._end(JobState.STOPPED, reason or "stopped on request")

    # ================================================================== JobControl

    def worker_lost(self, worker_id: int) -> None:
        """A worker process ended (the instance manager says so)."""
        with self.lock:
            if self.strategy.worker_lost(worker_id):
                self.release(worker_id)

    def release(self, worker_id: int) -> None:
        """Give a lost worker's tasks back: what it had not reported goes to the queue."""
        with self.lock, self.journal.transaction():
            for task, left in self.queue.release_worker(worker_id):
                self.journal.append(
                    EventKind.REQUEUE,
                    worker=worker_id,
                    task=task.task_id,
                    kind=pb.TaskType.Name(task.kind).lower(),
                    batches=len(left),
                    epoch=task.epoch,
                )
            self._work.notify_all()
            self._wake.set()

    def fail(self, message: str) -> None:
        with self.lock:
            self._fail(message)

    def end_worker(self, worker_id: int) -> None:
        self.instances.launcher.kill(Role.WORKER, worker_id, True)

    def wake(self) -> None:
        self._wake.set()

    def work_changed(self) -> None:
        self._work.notify_all()  # (the caller holds the lock)

    def _fail(self, message: str) -> None:
        if self.state not in MASTER_END_STATES:
            self.error = message
            self._end(JobState.FAILED, message)

    def _end(self, state: JobState, reason: str) -> None:
        self.state, self.ended = state, time.time()
        self.instances.shutting_down = True  # no relaunches from here on: the job is over
        self.journal.append(EventKind.JOB_STATE, state=state, reason=reason, **self._progress())
        self.finished.set()
        self._wake.set()
        self._work.notify_all()

    # ================================================================== status

    def _progress(self) -> dict:
        return {**self.progress.fields(self.epoch), **self.goodput.fields()}

    def status(self) -> dict:
        with self.lock:
            return {
                "name": self.name,
                "state": self.state,
                "phase": self.phase,
                "error": self.error,
                "started": self.started,
                "ended": self.ended,
                **self._progress(),
                "workers": len(self.instances.active_workers()),
                "desired_workers": self.instances.desired_workers,
                "ps": self.spec.parameter_servers,
                "instances": self.instances.table(),
                "metrics": self.evaluations.last_metrics,
                "strategy": self.spec.strategy,
                **self.strategy.status_fields(),
                "events": len(self.journal),
                "master_restarts": self.incarnation,
                "stragglers": self.stragglers.status(),
                "model_path": self.export_path if self.phase in _EXPORTED else "",
            }

    # ================================================================== coordinator

    def run(self) -> None:
        """Drive the job until it ends; runs on its own thread. (A master that took the
        job over from one that died goes on where that one was: `recovery.py`.)"""
        if self.callbacks:
            self.callbacks.start()
        with self.lock:
            if not self.incarnation:
                self.journal.append(
                    EventKind.JOB_STATE,
                    state=JobState.RUNNING,
                    reason="started",
                    **self._progress(),
                )
        while not self.finished.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            try:
                self._coordinate()
                self.strategy.observe()
            except Exception as exc:  # a bug here must end the job visibly, not hang it
                log.exception("coordinator failed")
                self.fail(f"master error: {exc!r}")

    def _coordinate(self) -> None:
        with self.lock, self.journal.transaction():
            if self.state in MASTER_END_STATES or not self.strategy.ready_to_train():
                return
            self.strategy.tick()
            if self.epoch < 0:
                if self.callbacks and not self.callbacks.loaded.is_set():
                    return  # (the first epoch starts once they are loaded)
                self._call_back(lambda c: c.epoch_begin(0))
                self.start_epoch(0)
                return
            if (
                self.callbacks
                and self.callbacks.loaded.is_set()  # (a new master: not held up by loading)
                and self.phase == Phase.TRAINING
                and self.step != self._steps_seen
            ):
                self._steps_seen = self.step
                self._call_back(lambda c: c.steps_done(self.step))
            last_epoch = self.epoch
            reconcile = self.strategy.reconcile_needed() or (
                self.phase == Phase.TRAINING and not self.queue.training_pending()
            )
        if reconcile and not self.strategy.reconcile(last_epoch):
            return
        self.evaluations.publish_finished()
        with self.lock, self.journal.transaction():  # (an epoch's tasks and its event)
            if self.state in MASTER_END_STATES or self.queue.training_pending():
                return
            if self.phase == Phase.TRAINING:
                if self.callbacks:
                    self.callbacks.epoch_trained(self.epoch)
                if self.spec.evaluation_steps == 0 and self.validation:
                    # (the epoch's end is called back once this round is in: _evaluated)
                    last = self.epoch == self.spec.epochs - 1 or bool(self.stop_reason)
                    self.start_evaluation(final=last, epoch=self.epoch)
                else:
                    # (evaluating every N steps: the newest round's metrics)
                    self._call_back(lambda c: c.epoch_end(self.epoch, self._newest_metrics()))
                if self.epoch + 1 < self.spec.epochs and not self.stop_reason:
                    self._call_back(lambda c: c.epoch_begin(self.epoch + 1))
                    self.start_epoch(self.epoch + 1)
                    return
                self.phases.move(Phase.EVALUATING)
                if self.validation and not self.evaluations.final_started:
                    self.start_evaluation(final=True)
            if self.phase == Phase.EVALUATING:
                if self.queue.pending(EVALUATION) or self.evaluations.open:
                    return
                self.phases.move(Phase.EXPORTING)
                self.queue.add_export(self.export_path, self._saved_model_path())
                self._work.notify_all()
                return
            if self.phase == Phase.EXPORTING:
                if self.queue.pending(EXPORT):
                    return
                self.phases.move(Phase.FINISHING)
        self._finish()

    # ================================================================== callbacks

    def _call_back(self, call: Callable) -> None:
        """Call the callbacks (`call(callbacks)` -> Decisions) and act on what they
        decided; a callback that fails fails the job. Under the lock, in one journal
        transaction: the calls are journaled, and from every thread in one order."""
        if not self.callbacks:
            return
        with self.lock, self.journal.transaction():
            try:
                decided = call(self.callbacks)
            except CallbackError as exc:
                self._fail(f"callback failed: {exc}")
                return
            self._decided(decided)

    def _decided(self, decided: Decisions) -> None:
        if decided.learning_rate is not None and decided.learning_rate != self.learning_rate:
            self.learning_rate = decided.learning_rate
            self.learning_rate_set += 1
            self.journal.append(
                EventKind.LEARNING_RATE,
                rate=self.learning_rate,
                set=self.learning_rate_set,
                by=decided.set_by,
                epoch=self.epoch,
                step=self.step,
            )
        if decided.stop and not self.stop_reason and self.state not in MASTER_END_STATES:
            self.stop_reason = decided.stop
            dropped = self.queue.stop_training()
            self.journal.append(
                EventKind.TRAINING_STOPPED,
                reason=decided.stop,
                epoch=self.epoch,
                step=self.step,
                dropped=dropped,
            )
            self._wake.set()

    def _newest_metrics(self) -> dict:
        """The newest evaluation's metrics, by name (none before the first)."""
        return {k: v for k, v in self.evaluations.last_metrics.items() if k != "step"}

    def _saved_model_path(self) -> str:
        """Where the export writes a SavedModel: export_format's, or where ElasticDL's
        `SavedModelExporter` callback asks ("" = none)."""
        exporters = self.callbacks.of_type("SavedModelExporter") if self.callbacks else []
        if exporters:
            return exporters[-1].export_dir or str(JobDir(self.job_dir).saved_model)
        return self.saved_model_path

    def _evaluated(self, metrics: dict, epoch: int | None) -> None:
        """An evaluation round is in (the evaluator thread, under the lock, with the
        round's event): the callbacks' test end, and the end of the epoch that waited."""
        self._call_back(lambda c: c.test_end(metrics))
        if epoch is not None:
            self._call_back(lambda c: c.epoch_end(epoch, metrics))

    def start_epoch(self, epoch: int) -> None:
        """Queue an epoch's training tasks (the coordinator's step, under the lock)."""
        self.epoch = epoch
        tasks = self.queue.add_epoch(epoch)
        self._work.notify_all()
        self.journal.append(EventKind.EPOCH, epoch=epoch, tasks=tasks)

    def start_evaluation(self, final: bool, epoch: int | None = None) -> None:
        """Queue an evaluation round of the model as it is now (under the lock); `epoch`:
        the epoch whose end it judges (its callbacks wait for it)."""
        self.evaluations.start(self.step, final, epoch)
        self._work.notify_all()

    def _finish(self) -> None:
        """The final checkpoint, then `succeeded`; back to training if a PS lost work."""
        versions = self.strategy.final_checkpoint()
        if versions is None:  # not now: what was lost is found and redone in training
            with self.lock:
                self.phases.move(Phase.TRAINING)
            return
        if not self.strategy.reconcile(self.epoch):
            return
        self.strategy.observe(final=True)  # (round trips to the PS: outside the lock)
        with self.lock:
            if self.state in MASTER_END_STATES:  # stopped or failed while checkpointing
                return
            if self.queue.training_pending():  # a PS lost work at the very end: redo it
                self.phases.move(Phase.TRAINING)
                return
            with self.journal.transaction():  # (the end and the callbacks' end: together)
                if versions:
                    self.journal.append(EventKind.CHECKPOINT, versions=versions, final=True)
                self._call_back(lambda c: c.train_end(self._newest_metrics()))
                if self.state in MASTER_END_STATES:  # (a callback failed)
                    return
                self.phases.move(Phase.DONE)
                self._end(JobState.SUCCEEDED, self.stop_reason or "all epochs done")
