"""The master's façade: one job over its tasks, epochs, evaluation rounds and instances.

`JobMaster` holds the job's state (queue, epoch, phase, progress, state) under one lock
and is what the rest of the master calls (the gRPC service, `serve`, `recovery.py`, the
strategy as `JobControl`). Its parts each do one job:

- `task_desk.TaskDesk`: GetTask and ReportProgress, counted once however often retried;
- `coordinator.Coordinator`: the thread that moves the job on (epochs, phases, the end);
- `callback_decisions.CallbackDecisions`: the model's callbacks and what they decided;
- `evaluation.py`, `progress.py`, `phases.py`, `instances.py`: evaluation rounds,
  progress, phases, the instances (the elastic policy);
- the strategy (`strategy.TrainingStrategy`): whatever depends on how gradients are
  applied (parameter servers or allreduce).

Phases (`phases.py`): training -> evaluating -> exporting -> finishing -> done, and
from finishing back to training when a PS lost work at the very end. A failure report, a
spent relaunch budget or an error in the master ends the job `failed`; `Stop`, `stopped`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.callback_decisions import CallbackDecisions
from elasticdl_nb.runtime.master.coordinator import Coordinator
from elasticdl_nb.runtime.master.evaluation import Evaluations
from elasticdl_nb.runtime.master.goodput import Goodput
from elasticdl_nb.runtime.master.growth import ThroughputGrowth
from elasticdl_nb.runtime.master.instances import InstanceManager, LauncherFor
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.phases import Phases
from elasticdl_nb.runtime.master.progress import Progress
from elasticdl_nb.runtime.master.saturation import Saturation
from elasticdl_nb.runtime.master.stragglers import Stragglers
from elasticdl_nb.runtime.master.strategy import JobControl, TrainingStrategy
from elasticdl_nb.runtime.master.task_desk import TaskDesk
from elasticdl_nb.runtime.master.tasks import TaskQueue
from elasticdl_nb.runtime.master.worker_floor import WorkerFloor
from elasticdl_nb.runtime.master.worker_silence import WorkerSilence
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.server_load import ServerLoad
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind, JobState, Phase, Role

# The phases in which the model is exported (its path is in the status).
_EXPORTED = (Phase.FINISHING, Phase.DONE)


class JobMaster:
    """One job's master: its task queue, epochs, evaluation rounds, progress, state and
    phase; its instances (`instances`, the elastic policy) and its training strategy
    (`strategy`). Made by `assembly.build_master`; `run` drives it on its own thread.

    Threading: `lock`, a re-entrant lock owned here, guards the queue, the job's state,
    the instance table (the `InstanceManager` is given it), the strategy's state and
    every part's. Who calls whom:
    - gRPC threads (`service.MasterService`) call `get_task`, `report` (the task desk),
      `scale`, `stop`, `status`, and the strategy's own RPCs;
    - the launcher's threads call `instances.on_event`, which calls back `worker_lost`,
      `strategy.ps_lost` and `fail`, under the lock;
    - the coordinator thread (`run`) calls the strategy's `reconcile` and
      `final_checkpoint` without holding the lock (they call the PS);
    - the evaluator thread turns finished evaluation rounds into metrics, and calls the
      callbacks back (`CallbackDecisions.evaluated`);
    - the strategy calls back only through `JobControl` (`release`, `fail`, `end_worker`,
      `wake`, `work_changed`).
    """

    # What a snapshot holds of the job itself (snapshot.py; `restore_state`).
    STATE = ("state", "error", "epoch", "started", "ended", "restarts")

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
        prediction: list[SourceInfo] = (),
        server_load: ServerLoad | None = None,
    ):
        self.spec, self.journal, self.job_dir = spec, journal, job_dir
        self.name = spec.name or Path(job_dir).name
        self.lock = threading.RLock()
        self.queue = _task_queue(spec, train, validation, prediction, journal)
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
        self.finished = threading.Event()
        self.incarnation = 0  # how many masters of this job died before this one
        self.restarts = 0  # how many took it over so far (`master_restarted` events)
        self.rebuilt: dict = {}  # what rebuilding from the journal took (recovery.py)
        self.desk = TaskDesk(self)  # GetTask and ReportProgress
        self.silence = WorkerSilence()  # when each worker last spoke (TaskDesk says)
        self.saturation = (  # whether it keeps up with them (the coordinator looks)
            Saturation(journal.append, server_load, self.silence) if server_load else None
        )
        self.coordinator = Coordinator(self)
        self.decisions = CallbackDecisions(self, files.bundle, load_contract)
        self.evaluations = Evaluations(self, load_contract)
        self.evaluations.on_published = self.decisions.evaluated
        self.strategy = strategy_for(self)
        self.growth: ThroughputGrowth | None = None  # (scale_policy="throughput")
        self.instances = self._instance_manager(launcher_for)
        self.floor = WorkerFloor(
            journal.append,
            self.instances.takes_work,
            lambda: self.instances.min_workers,
            holds=self.strategy.holds_below_floor,
        )
        if spec.scale_policy == "throughput":
            self.growth = ThroughputGrowth(
                journal.append,
                bounds=lambda: (self.instances.min_workers, self.instances.desired_workers),
                running=self.floor.running,
                samples=lambda: self.step * spec.minibatch_size,
                converge=self.instances.converge,
            )

    def restore_state(self, state: dict) -> None:
        """A snapshot's state of the job (snapshot.py), as replaying it would set it."""
        for name, value in state.items():
            setattr(self, name, value)
        if self.state in MASTER_END_STATES:
            self.finished.set()

    def _instance_manager(self, launcher_for: LauncherFor) -> InstanceManager:
        """The job's instances under the elastic policy, guarded by the job's lock; a
        lost worker, a lost PS and a spent relaunch budget are called back here and to
        the strategy."""
        spec = self.spec
        return InstanceManager(
            launcher_for,
            self.journal,
            workers=spec.workers,
            min_workers=spec.min_workers,
            ps=spec.parameter_servers,
            max_worker_relaunches=spec.max_worker_relaunches,
            max_ps_relaunches=spec.max_ps_relaunches,
            standby=spec.standby_workers,
            on_worker_lost=self.worker_lost,
            on_ps_lost=self.strategy.ps_lost,
            on_job_failed=self.fail,
            on_work_for=lambda: self.work_changed(),  # (the desk is made after this)
            lock=self.lock,
            pending_timeout=spec.pending_timeout,
            log_tail=JobDir(self.job_dir).log_tail,
            ceiling=lambda: self.growth.asked if self.growth else None,
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
        """The next task for a worker (`TaskDesk.get_task`)."""
        return self.desk.get_task(worker_id, seq, wait_seconds)

    def report(self, r: pb.ProgressReport) -> pb.ProgressResponse:
        """A worker's progress report (`TaskDesk.report`)."""
        return self.desk.report(r)

    def scale(self, workers: int, min_workers: int = 0) -> dict:
        """Ask for `workers` workers; with `min_workers`, the range MIN:workers."""
        if workers < 1:
            raise ValueError("workers must be at least 1; stop the job to end it")
        if not 0 <= min_workers <= workers:
            raise ValueError(
                f"a range needs 1 <= MIN <= MAX, got {min_workers}:{workers}, e.g. '2:6'"
            )
        with self.lock:
            if self.state in MASTER_END_STATES:
                raise ValueError(f"the job is {self.state}")
            scaled = self.instances.scale(workers, min_workers=min_workers)
            if self.growth:
                self.growth.rescaled()
            self.floor.check()
            self.work_changed()  # (a lower MIN may free tasks held back)
            return scaled

    def start_instances(self) -> None:
        """Launch the PS and the workers asked for (a new job; a master that takes one
        over resumes instead: `recovery.resume`)."""
        with self.lock:
            if self.growth:
                self.growth.start()
            self.instances.start()

    def stop(self, reason: str) -> None:
        with self.lock:
            if self.state not in MASTER_END_STATES:
                self.end(JobState.STOPPED, reason or "stopped on request")

    # ================================================================== JobControl

    def worker_lost(self, worker_id: int) -> None:
        """A worker process ended (the instance manager says so)."""
        with self.lock:
            self.floor.lost(worker_id)
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
            self.work_changed()
            self.wake()

    def fail(self, message: str) -> None:
        with self.lock:
            if self.state not in MASTER_END_STATES:
                self.error = message
                self.end(JobState.FAILED, message)

    def end_worker(self, worker_id: int) -> None:
        """Kill a worker (it is replaced); returns at once, under the lock or not."""
        self.instances.end_soon(Role.WORKER, worker_id)

    def wake(self) -> None:
        self.coordinator.wake()

    def work_changed(self) -> None:
        self.desk.work.notify_all()  # (the caller holds the lock)

    # ================================================================== the job

    def end(self, state: JobState, reason: str) -> None:
        """End the job in `state` (under the lock), journaled with its progress."""
        self.state, self.ended = state, time.time()
        self.instances.shutting_down = True  # no relaunches from here on: the job is over
        self.journal.append(
            EventKind.JOB_STATE, state=state, reason=reason, **self.progress_fields()
        )
        self.finished.set()
        self.wake()
        self.work_changed()

    def start_epoch(self, epoch: int) -> None:
        """Queue an epoch's training tasks (the coordinator's step, under the lock)."""
        self.epoch = epoch
        tasks = self.queue.add_epoch(epoch)
        self.work_changed()
        self.journal.append(EventKind.EPOCH, epoch=epoch, tasks=tasks)

    def start_evaluation(self, final: bool, epoch: int | None = None) -> None:
        """Queue an evaluation round of the model as it is now (under the lock); `epoch`:
        the epoch whose end it judges (its callbacks wait for it)."""
        self.evaluations.start(self.step, final, epoch)
        self.work_changed()

    def run(self) -> None:
        """Drive the job until it ends, on the calling thread (`Coordinator.run`)."""
        self.coordinator.run()

    # ================================================================== status

    def progress_fields(self) -> dict:
        """How far the job is: the fields of `progress` and `job_state` events and of
        the status."""
        return {**self.progress.fields(self.epoch), **self.goodput.fields()}

    def status(self) -> dict:
        with self.lock:
            workers = self.instances.active_workers()
            pending = self.instances.pending_workers()
            return {
                "name": self.name,
                "state": self.state,
                "phase": self.phase,
                "error": self.error,
                "started": self.started,
                "ended": self.ended,
                **self.progress_fields(),
                # workers: every worker the job holds, running or pending (a pod placed
                # or waiting for room); running_workers: those started
                "workers": len(workers),
                "running_workers": len([w for w in workers if w not in pending]),
                "desired_workers": self.instances.desired_workers,
                "min_workers": self.instances.min_workers,
                "pending_workers": [
                    {"id": worker, "reason": why} for worker, why in sorted(pending.items())
                ],
                "waiting_for_workers": self.floor.held(),
                **(
                    {"standby_workers": len(self.instances.standby_ids())}
                    if self.spec.standby_workers
                    else {}
                ),
                **({"growth": self.growth.status()} if self.growth else {}),
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


def _task_queue(
    spec: JobSpec,
    train: list[SourceInfo],
    validation: list[SourceInfo],
    prediction: list[SourceInfo],
    journal: Journal,
) -> TaskQueue:
    """The job's task queue, every change to it journaled before anyone hears of it (what
    a master that takes the job over replays: recovery.py)."""
    queue = TaskQueue(
        train,
        validation,
        spec.minibatch_size,
        spec.minibatches_per_task,
        spec.shuffle,
        spec.seed,
        prediction=prediction,
    )
    queue.record = lambda entry: journal.append(EventKind.QUEUE, **entry)
    return queue
