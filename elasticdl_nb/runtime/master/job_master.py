"""The master's brain: the job's state machine over tasks, instances and the PS.

RPC handlers only record what workers and parameter servers tell it and wake the
coordinator thread; the coordinator (`_coordinate`) makes every decision that needs a
round trip to the PS — verifying that every minibatch of an epoch is really applied on
every shard before the epoch counts as done, and re-queueing what a restored PS lost.

Phases: training -> final evaluation -> export -> final checkpoint -> succeeded.
A failure report or a spent relaunch budget ends in `failed`; `Stop` in `stopped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.allreduce_group import AllreduceGroup
from elasticdl_nb.runtime.master.instances import InstanceManager
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.tasks import EVALUATION, EXPORT, TRAINING, TaskQueue
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.protocol.tensors import to_array
from elasticdl_nb.spec import JobSpec

log = logging.getLogger("elasticdl_nb.master")

RUNNING, SUCCEEDED, FAILED, STOPPED = "running", "succeeded", "failed", "stopped"
TERMINAL = frozenset({SUCCEEDED, FAILED, STOPPED})
TRAINING_PHASE, FINAL_EVAL, EXPORTING, FINISHING = (
    "training",
    "evaluating",
    "exporting",
    "finishing",
)


class EvalRound:
    def __init__(self, step: int, tasks: int, final: bool):
        self.step, self.tasks_left, self.final = step, tasks, final
        self.states: dict[str, list[np.ndarray]] = {}
        self.publishing = False

    def add(self, states: list[pb.MetricState]) -> None:
        for state in states:
            values = [to_array(t).astype(np.float64) for t in state.variables]
            have = self.states.get(state.name)
            self.states[state.name] = (
                values if have is None else [a + b for a, b in zip(have, values)]
            )
        self.tasks_left -= 1


class JobMaster:
    def __init__(
        self,
        spec: JobSpec,
        name: str,
        journal: Journal,
        train: list[SourceInfo],
        validation: list[SourceInfo],
        ps_addrs: list[str],
        token: str,
        job_dir: Path,
        load_contract,
    ):
        self.spec, self.name, self.journal = spec, name, journal
        self.job_dir = job_dir
        self._load_contract = load_contract  # lazy: the master imports TF only to evaluate
        self.lock = threading.RLock()
        self.queue = TaskQueue(
            train,
            validation,
            spec.minibatch_size,
            spec.minibatches_per_task,
            spec.shuffle,
            spec.seed,
        )
        self.validation = validation
        self.records_per_epoch = sum(s.num_records for s in train)
        # Where each PS serves ("" while it is not up) and a stub for it. Fixed addresses
        # (a Service per PS) are known now; elsewhere each PS reports the port it bound.
        self._token = token
        self.num_ps = spec.parameter_servers
        self.ps_addresses = list(ps_addrs) or [""] * self.num_ps
        self.ps: list[rpc.ParameterServerStub | None] = [None] * self.num_ps
        self._ps_incarnations = [0] * self.num_ps
        self.instances: InstanceManager | None = None  # set by the process entry point
        self.state, self.phase, self.error = RUNNING, TRAINING_PHASE, ""
        self.epoch = -1
        self.loss_points = 0  # training losses reported (a redone minibatch reports again)
        self.started = time.time()
        self.ended: float | None = None
        self.rounds: dict[int, EvalRound] = {}  # evaluations in progress
        self._round_counter = 0
        self.final_eval_started = False
        self.last_metrics: dict = {}
        self.ps_seen_version = [0] * self.num_ps
        self._ps_up = [False] * self.num_ps  # (ever: a later ready is a relaunched PS)
        self.needs_reconcile = False
        self.export_path = str(JobDir(job_dir).model)
        self._records_window: deque[tuple[float, int]] = deque()
        self._wake = threading.Event()
        self._work = threading.Condition(self.lock)  # notified when tasks may be there
        self._evaluator = ThreadPoolExecutor(1, thread_name_prefix="evaluator")
        self.finished = threading.Event()
        # Retried calls (see protocol/patience.py): per worker, the task its newest GetTask
        # was given, which GetTask call is the newest, and the newest report counted.
        self._task_given: dict[int, tuple[int, pb.Task]] = {}
        self._task_asking: dict[int, int] = {}
        self._asks = 0
        self._reports_counted: dict[int, int] = {}
        self.group: AllreduceGroup | None = None
        if spec.strategy == "allreduce":
            self.group = AllreduceGroup(
                spec.workers, journal.append, self.lock, self.queue, self._release, self.fail,
                kill=lambda worker: self.instances.launcher.kill("worker", worker, True),
            )  # fmt: skip

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
                if self.state in TERMINAL:
                    return pb.Task(type=pb.FINISHED)
                if not self.instances.takes_work(worker_id):
                    if self.group is None:
                        return pb.Task(type=pb.FINISHED)
                    # An allreduce member leaves at a step boundary the group agrees on:
                    # it gets no more work, and learns from the group when to go.
                    self.group.retiring(worker_id)
                    return pb.Task(type=pb.NONE, wait_seconds=0.5)
                task = self.queue.next_for(worker_id) if self.epoch >= 0 else None
                if task is not None:
                    message = task.to_message()
                    if seq:
                        self._task_given[worker_id] = (seq, message)
                    return message
                if self.group is None and self.queue.holds(worker_id):
                    # It still holds a task whose last push it sends with its next pull:
                    # no more work now, so it sends that push first (and may end the epoch).
                    return pb.Task(type=pb.NONE, wait_seconds=0.05)
                self._wake.set()
                left = deadline - time.monotonic()
                if left <= 0:  # (an allreduce member's feed asks again at once: it waited)
                    return pb.Task(type=pb.NONE, wait_seconds=0.0 if self.group else 0.05)
                self._work.wait(left)

    def report(self, r: pb.ProgressReport) -> pb.ProgressResponse:
        with self.lock:
            if r.seq and r.seq <= self._reports_counted.get(r.worker_id, 0):
                return self._progress_response(r.worker_id)  # a retry: counted already
            if r.seq:
                self._reports_counted[r.worker_id] = r.seq
            if r.error:
                where = "user code" if r.error_is_user_code else "the worker"
                self._fail(f"worker {r.worker_id} failed in {where}:\n{r.error}")
                return pb.ProgressResponse(stop=True)
            for ps_id, version in enumerate(r.ps_versions):
                if ps_id < len(self.ps_seen_version):
                    self.ps_seen_version[ps_id] = max(self.ps_seen_version[ps_id], version)
            fresh = self.queue.report(r.task_id, list(r.batch_starts))
            if fresh:
                self._count_progress(fresh)
            if r.losses:
                first = self.loss_points + 1
                self.loss_points += len(r.losses)
                self.journal.append(
                    "loss",
                    worker=r.worker_id,
                    points=[[first + i, round(float(p.loss), 6)] for i, p in enumerate(r.losses)],
                )
            if r.task_done:
                self._task_done(r)
            if r.HasField("settled"):
                s = r.settled
                self.journal.append(
                    "group_settled", version=s.version, step=s.step,
                    seconds=round(s.seconds, 6), cause=s.cause, worker=r.worker_id,
                    completed_at=s.completed_at,
                )  # fmt: skip
            self._wake.set()
            return self._progress_response(r.worker_id)

    def _progress_response(self, worker_id: int) -> pb.ProgressResponse:
        stop = self.state in TERMINAL
        if self.group is None:  # (an allreduce member that retires leaves with the group)
            stop = stop or not self.instances.takes_work(worker_id)
        return pb.ProgressResponse(stop=stop)

    @property
    def step(self) -> int:
        """Minibatches applied so far, each counted once."""
        return self.queue.done_count

    def _count_progress(self, fresh: list[int]) -> None:
        before = self.step - len(fresh)
        every = self.spec.evaluation_steps
        if every and self.validation and before // every != self.step // every:
            self._start_eval(final=False)
        self._records_window.append((time.monotonic(), len(fresh) * self.spec.minibatch_size))

    def _task_done(self, r: pb.ProgressReport) -> None:
        assignment = self.queue.finish(r.task_id)
        if assignment is None:
            return
        task = assignment.task
        if task.kind == TRAINING:
            if r.HasField("timing"):
                t = r.timing
                self.journal.append(
                    "worker_time",
                    worker=r.worker_id,
                    task=r.task_id,
                    minibatches=t.minibatches,
                    task_s=round(t.task_seconds, 6),
                    compute_s=round(t.compute_seconds, 6),
                    wait_s=round(t.wait_seconds, 6),
                )
            self.journal.append("progress", **self._progress())
        elif task.kind == EVALUATION:
            eval_round = self.rounds.get(task.eval_round)
            if eval_round is not None:
                eval_round.add(r.metric_states)
        elif task.kind == EXPORT:
            self.journal.append("export", path=task.export_path, worker=r.worker_id)

    def ps_ready(self, ps_id: int, restored_version: int, address: str, incarnation: int) -> None:
        with self.lock:
            if incarnation == self._ps_incarnations[ps_id]:
                return  # a retried report: this PS is counted already
            self._ps_incarnations[ps_id] = incarnation
            self.ps_addresses[ps_id] = address
            self.ps[ps_id] = rpc.ParameterServerStub(
                open_channel(address, self._token, f"ps-{ps_id}")
            )
            if self._ps_up[ps_id]:  # a relaunched PS: what did it lose?
                lost = max(0, self.ps_seen_version[ps_id] - max(restored_version, 0))
                self.journal.append(
                    "ps_restored",
                    ps=ps_id,
                    restored_version=restored_version,
                    newest_seen_version=self.ps_seen_version[ps_id],
                    updates_rolled_back=lost,
                )
                self.ps_seen_version[ps_id] = max(restored_version, 0)
                self.needs_reconcile = True
            self._ps_up[ps_id] = True
            self.journal.append(
                "instance", role="ps", id=ps_id, kind="running", restored_version=restored_version
            )
            self._wake.set()

    def ps_lost(self, ps_id: int) -> None:
        """A PS ended: nobody is to call it at its old address until it is back."""
        with self.lock:
            self.ps_addresses[ps_id] = ""
            self.ps[ps_id] = None

    def worker_lost(self, worker_id: int) -> None:
        with self.lock:
            if self.group is None or self.group.worker_ended(worker_id):
                self._release(worker_id)

    def _release(self, worker_id: int) -> None:
        """Give a lost worker's tasks back: what it had not reported goes to the queue."""
        with self.lock:
            for task, left in self.queue.release_worker(worker_id):
                self.journal.append(
                    "requeue",
                    worker=worker_id,
                    task=task.task_id,
                    kind=pb.TaskType.Name(task.kind).lower(),
                    batches=len(left),
                    epoch=task.epoch,
                )
            self._work.notify_all()
            self._wake.set()

    def scale(self, workers: int) -> dict:
        if workers < 1:
            raise ValueError("workers must be at least 1; stop the job to end it")
        with self.lock:
            if self.state in TERMINAL:
                raise ValueError(f"the job is {self.state}")
            return self.instances.scale(workers)

    def stop(self, reason: str) -> None:
        with self.lock:
            if self.state not in TERMINAL:
                self._end(STOPPED, reason or "stopped on request")

    def fail(self, message: str) -> None:
        with self.lock:
            self._fail(message)

    def _fail(self, message: str) -> None:
        if self.state not in TERMINAL:
            self.error = message
            self._end(FAILED, message)

    def _end(self, state: str, reason: str) -> None:
        self.state, self.ended = state, time.time()
        if self.instances:  # no relaunches from here on: the job is over
            self.instances.shutting_down = True
        self.journal.append("job_state", state=state, reason=reason, **self._progress())
        self.finished.set()
        self._wake.set()
        self._work.notify_all()

    # ================================================================== status

    def _progress(self) -> dict:
        now = time.monotonic()
        while self._records_window and now - self._records_window[0][0] > 10:
            self._records_window.popleft()
        window = self._records_window
        span = now - window[0][0] if len(window) > 1 else 0
        rate = sum(n for _, n in list(window)[1:]) / span if span > 0 else 0.0
        epoch = max(self.epoch, 0)
        return {
            "epoch": epoch,
            "epochs": self.spec.epochs,
            "step": self.step,
            "records_done": self.queue.records_done(epoch),
            "records_per_epoch": self.records_per_epoch,
            "records_per_second": round(rate, 1),
        }

    def status(self) -> dict:
        with self.lock:
            workers = self.instances.active_workers() if self.instances else []
            return {
                "name": self.name,
                "state": self.state,
                "phase": self.phase,
                "error": self.error,
                "started": self.started,
                "ended": self.ended,
                **self._progress(),
                "workers": len(workers),
                "desired_workers": self.instances.desired_workers if self.instances else 0,
                "ps": self.num_ps,
                "instances": self.instances.table() if self.instances else [],
                "metrics": self.last_metrics,
                "strategy": self.spec.strategy,
                **({"group": self.group.status()} if self.group else {}),
                "events": len(self.journal),
                "model_path": self.export_path if self.phase == FINISHING else "",
            }

    # ================================================================== coordinator

    def run(self) -> None:
        """Drive the job until it ends; runs on its own thread."""
        with self.lock:
            self.journal.append("job_state", state=RUNNING, reason="started", **self._progress())
        while not self.finished.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            try:
                self._coordinate()
            except Exception as exc:  # a bug here must end the job visibly, not hang it
                log.exception("coordinator failed")
                self.fail(f"master error: {exc!r}")

    def _coordinate(self) -> None:
        with self.lock:
            if self.state in TERMINAL or not all(self._ps_up):
                return
            if self.group:
                self.group.overdue_releases()
            if self.epoch < 0:
                self._start_epoch(0)
                return
            reconcile = self.needs_reconcile or (
                self.phase == TRAINING_PHASE and not self.queue.training_pending()
            )
        if reconcile and not self._reconcile():
            return
        self._finish_evaluations()
        with self.lock:
            if self.state in TERMINAL or self.queue.training_pending():
                return
            if self.phase == TRAINING_PHASE:
                if self.spec.evaluation_steps == 0 and self.validation:
                    self._start_eval(final=self.epoch == self.spec.epochs - 1)
                if self.epoch + 1 < self.spec.epochs:
                    self._start_epoch(self.epoch + 1)
                    return
                self.phase = FINAL_EVAL
                if self.validation and not self.final_eval_started:
                    self._start_eval(final=True)
            if self.phase == FINAL_EVAL:
                if self.queue.pending(EVALUATION) or self.rounds:
                    return
                self.phase = EXPORTING
                self.queue.add_export(self.export_path)
                self._work.notify_all()
                self.journal.append("phase", phase=EXPORTING)
                return
            if self.phase == EXPORTING and self.queue.pending(EXPORT):
                return
            self.phase = FINISHING
        self._final_checkpoint()

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        tasks = self.queue.add_epoch(epoch)
        self._work.notify_all()
        self.journal.append("epoch", epoch=epoch, tasks=tasks)

    def _start_eval(self, final: bool) -> None:
        round_id = self._round_counter
        self._round_counter += 1
        self.final_eval_started |= final
        tasks = self.queue.add_evaluation(round_id)
        self._work.notify_all()
        self.rounds[round_id] = EvalRound(self.step, tasks, final)
        self.journal.append("evaluation_started", round=round_id, step=self.step, tasks=tasks)

    def _finish_evaluations(self) -> None:
        """Hand finished evaluation rounds to the evaluator thread: turning metric states
        into values imports TensorFlow the first time (seconds), which must not hold up
        the coordinator."""
        with self.lock:
            for round_id, eval_round in self.rounds.items():
                if eval_round.tasks_left <= 0 and not eval_round.publishing:
                    eval_round.publishing = True
                    self._evaluator.submit(self._publish_evaluation, round_id, eval_round)

    def _publish_evaluation(self, round_id: int, eval_round: EvalRound) -> None:
        from elasticdl_nb.model.metrics import merged_results

        try:
            metrics = merged_results(self._load_contract(), eval_round.states)
        except Exception as exc:  # a metric that cannot be merged ends the job visibly
            log.exception("evaluation round %d", round_id)
            self.fail(f"evaluation metrics could not be computed: {exc!r}")
            return
        with self.lock:
            self.last_metrics = {"step": eval_round.step, **metrics}
            self.journal.append(
                "evaluation",
                round=round_id,
                step=eval_round.step,
                metrics=metrics,
                final=eval_round.final,
            )
            del self.rounds[round_id]
            self._wake.set()

    def _applied_everywhere(self) -> dict[tuple[int, int], set[int]] | None:
        """Minibatches applied on every PS shard, or None if a shard did not answer."""
        common: dict[tuple[int, int], set[int]] | None = None
        for ps_id, stub in enumerate(list(self.ps)):
            if stub is None:
                log.info("PS %d is not up: GetApplied later", ps_id)
                return None
            try:
                reply = stub.GetApplied(pb.AppliedRequest(), timeout=10)
            except Exception as exc:  # a PS that is down is relaunched; ask again later
                log.info("PS not answering GetApplied: %s", exc)
                return None
            shard = {(e.epoch, e.source): set(e.batch_keys) for e in reply.entries}
            if common is None:
                common = shard
            else:
                common = {k: v & shard.get(k, set()) for k, v in common.items()}
        return common or {}

    def _reconcile(self) -> bool:
        """Compare what the master counts done with what every PS holds, and queue again
        whatever is missing: for an epoch whose tasks have all ended, every minibatch must
        be held; for the open epoch, every minibatch reported done (a PS restored from a
        checkpoint lost the newer ones). Returns False when a PS did not answer."""
        if not self.num_ps:  # allreduce: the workers' reports are the record (AllreduceGroup)
            self.needs_reconcile = False
            return True
        applied = self._applied_everywhere()
        if applied is None:
            return False
        with self.lock:
            self.needs_reconcile = False
            for epoch in range(self.epoch + 1):
                closed = not self.queue.training_pending(epoch)
                for source in range(len(self.queue.train)):
                    held = applied.get((epoch, source), set())
                    if closed:
                        missing = self.queue.settle(epoch, source, held)
                    else:
                        done = self.queue.done.get((epoch, source), set())
                        missing = sorted(done - held)
                        self.queue.requeue_batches(epoch, source, missing, "rolled back")
                    if missing:
                        self.journal.append(
                            "requeue",
                            reason="not applied on every PS",
                            epoch=epoch,
                            source=source,
                            batches=len(missing),
                        )
            self._work.notify_all()
            return True

    def _final_checkpoint(self) -> None:
        versions = []
        for stub in list(self.ps):
            try:
                if stub is None:
                    raise ConnectionError("a PS is not up")
                versions.append(stub.Checkpoint(pb.Empty(), timeout=60).version)
            except Exception as exc:
                log.info("final checkpoint not taken yet: %s", exc)
                with self.lock:
                    self.phase = TRAINING_PHASE
                    self.needs_reconcile = True
                return
        if not self._reconcile():
            return
        with self.lock:
            if self.queue.training_pending():  # a PS lost work at the very end: redo it
                self.phase = TRAINING_PHASE
                return
            if versions:
                self.journal.append("checkpoint", versions=versions, final=True)
            self._end(SUCCEEDED, "all epochs done")
