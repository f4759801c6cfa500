"""The task desk: the master's side of a worker's two calls, GetTask and ReportProgress.

A worker asks for a task and reports what it did. Both calls are retried when their reply
is lost (protocol/patience.py), so the desk remembers, per worker, the task its newest
numbered GetTask was given and the newest report it counted: a retry gets the same task,
and a report is counted once. A master that takes the job over rebuilds that memory from
the journal (`recovery.py`, through `remember_task_given` and `remember_report_counted`).

What a report means for the job (minibatches done, losses, the end of a task: its
timing, an evaluation's metric states, a prediction task's file, an export) is journaled
here, in the report's one transaction; what follows from it is the coordinator's to
decide (`coordinator.py`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from elasticdl_nb.runtime.master.evaluation import metric_states
from elasticdl_nb.runtime.master.tasks import EVALUATION, EXPORT, PREDICTION, TRAINING
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind, Phase

if TYPE_CHECKING:
    from elasticdl_nb.runtime.master.job_master import JobMaster

# A GetTask that finds no work waits for some, holding one of the server's threads; at
# most this many wait at once (of saturation.THREADS): at an epoch's end a thousand
# workers ask with nothing queued, and their waits held every thread while the reports
# that end the epoch queued behind them. The others are told to ask again later.
WAITING_ASKS = 16
ASK_AGAIN_S = 1.0  # (as long as the wait they were not given)


class TaskDesk:
    """Guarded by the job's lock, like the queue and the state it reads. `work`, on that
    lock, is notified whenever tasks may be there for a waiting GetTask."""

    # (a GetTask waiting now is this process's: its asker calls the new master again)
    STATE = ("_task_given", "_reports_counted")

    def __init__(self, job: JobMaster):
        self._job = job
        self.work = threading.Condition(job.lock)
        # Per worker: the task its newest GetTask was given (with that call's number),
        # which GetTask call is the newest, and the newest report counted.
        self._task_given: dict[int, tuple[int, pb.Task]] = {}
        self._task_asking: dict[int, int] = {}
        self._asks = 0
        self._waiting = 0  # GetTasks waiting for work now
        self._reports_counted: dict[int, int] = {}

    def get_task(self, worker_id: int, seq: int = 0, wait_seconds: float = 1.0) -> pb.Task:
        """The next task for a worker. With none queued, wait up to `wait_seconds` for
        one (the coordinator may be about to start an epoch) instead of letting the
        worker sleep through it.

        A worker asks one request at a time, numbered by `seq`: a retry of a request
        whose reply was lost gets the task that request was given, and a call that a
        newer one overtook (its caller stopped waiting) gives nothing away."""
        job = self._job
        job.silence.heard(worker_id)
        deadline = time.monotonic() + wait_seconds
        with job.lock:
            given = self._task_given.get(worker_id)
            if seq and given is not None and given[0] == seq:
                return given[1]
            self._asks += 1
            ask = self._task_asking[worker_id] = self._asks
            self.work.notify_all()  # an older call of this worker that waits: it is over
            while True:
                if self._task_asking[worker_id] != ask:  # (its caller reads the newer one)
                    return pb.Task(type=pb.NONE, wait_seconds=0.0)
                if job.state in MASTER_END_STATES:
                    return pb.Task(type=pb.FINISHED)
                if job.instances.stands_by(worker_id):  # no work, until it is promoted
                    if not self._wait(deadline):
                        return pb.Task(type=pb.NONE, wait_seconds=self._ask_again(0.0))
                    continue
                if not job.instances.takes_work(worker_id):
                    return job.strategy.task_for_unwanted(worker_id)
                job.floor.asked(worker_id)
                task = None
                held = job.phase == Phase.TRAINING and job.floor.held()  # (fewer than MIN)
                if job.epoch >= 0 and job.queue.todo and not held:  # (empty asks: no journal)
                    task = job.queue.next_for(worker_id, tags={"seq": seq} if seq else None)
                if task is not None:
                    return self._give(worker_id, seq, task)
                if job.strategy.pushes_before_more_work and job.queue.holds(worker_id):
                    # It still holds a task whose last push it sends with its next pull:
                    # no more work now, so it sends that push first (and may end the epoch).
                    return pb.Task(type=pb.NONE, wait_seconds=0.05)
                job.wake()
                if not self._wait(deadline):
                    idle = job.strategy.idle_wait_seconds
                    return pb.Task(type=pb.NONE, wait_seconds=self._ask_again(idle))

    def _wait(self, deadline: float) -> bool:
        """Wait for work until `deadline` (under the lock), unless it has passed or
        WAITING_ASKS calls wait already: False then."""
        left = deadline - time.monotonic()
        if left <= 0 or self._waiting >= WAITING_ASKS:
            return False
        self._waiting += 1
        try:
            self.work.wait(left)
        finally:
            self._waiting -= 1
        return True

    def _ask_again(self, idle: float) -> float:
        """How long a worker told "no work" waits before it asks again: `idle`, or
        ASK_AGAIN_S when as many calls wait on the desk as may."""
        return ASK_AGAIN_S if self._waiting >= WAITING_ASKS else idle

    def _give(self, worker_id: int, seq: int, task) -> pb.Task:
        """The message of a task handed to a worker; a training task carries the
        learning rate the callbacks set."""
        message = task.to_message()
        if task.kind == TRAINING:
            message.learning_rate = self._job.decisions.learning_rate
            message.learning_rate_set = self._job.decisions.learning_rate_set
        if seq:
            self.remember_task_given(worker_id, seq, message)
        return message

    def report(self, r: pb.ProgressReport) -> pb.ProgressResponse:
        job = self._job
        job.silence.heard(r.worker_id)
        if r == pb.ProgressReport(worker_id=r.worker_id, task_id=r.task_id, seq=r.seq):
            return self._progress_response(r.worker_id)  # a heartbeat: nothing to record
        # One transaction: a master killed between journaling a report and the end of its
        # task left a new one waiting forever for a task whose every minibatch was
        # reported (the worker's retry was "counted already").
        with job.lock, job.journal.transaction():
            if r.seq and r.seq <= self._reports_counted.get(r.worker_id, 0):
                return self._progress_response(r.worker_id)  # a retry: counted already
            if r.seq:
                self.remember_report_counted(r.worker_id, r.seq)
            if r.error:
                where = "user code" if r.error_is_user_code else "the worker"
                job.fail(f"worker {r.worker_id} failed in {where}:\n{r.error}")
                return pb.ProgressResponse(stop=True)
            fresh = job.queue.report(
                r.task_id, list(r.batch_starts), tags={"worker": r.worker_id, "seq": r.seq}
            )
            if fresh:
                self._count_progress(fresh)
            if r.losses:
                self._losses(r)
            if r.task_done:
                self._task_done(r)
            for outage in r.outages:
                job.journal.append(
                    EventKind.PEER_UNREACHABLE,
                    by=f"worker {r.worker_id}",
                    peer=outage.peer,
                    seconds=round(outage.seconds, 3),
                    times=outage.times,
                    healed=outage.healed,
                    detail=outage.detail,
                )
            job.strategy.worker_reported(r)
            job.wake()
            return self._progress_response(r.worker_id)

    def remember_task_given(self, worker_id: int, seq: int, task: pb.Task) -> None:
        """The task a worker's GetTask number `seq` got: a retry of it gets the same."""
        self._task_given[worker_id] = (seq, task)

    def remember_report_counted(self, worker_id: int, seq: int) -> None:
        """A worker's report number `seq` is counted: a retry of it is not counted again."""
        self._reports_counted[worker_id] = seq

    def _progress_response(self, worker_id: int) -> pb.ProgressResponse:
        job = self._job
        stop = job.state in MASTER_END_STATES or (
            job.strategy.stops_unwanted_on_report and not job.instances.wanted(worker_id)
        )
        return pb.ProgressResponse(stop=stop)

    def _count_progress(self, fresh: list[int]) -> None:
        job = self._job
        before = job.step - len(fresh)
        every = job.spec.evaluation_steps
        if every and job.validation and before // every != job.step // every:
            job.start_evaluation(final=False)
        job.progress.applied(len(fresh))

    def _losses(self, r: pb.ProgressReport) -> None:
        """A report's training losses: to the callbacks, and journaled, numbered."""
        job = self._job
        if job.decisions.callbacks:
            job.decisions.callbacks.losses([p.loss for p in r.losses])
        first = job.progress.number_losses(len(r.losses))
        rates = [[first + i, p.learning_rate] for i, p in enumerate(r.losses)]
        job.journal.append(
            EventKind.LOSS,
            worker=r.worker_id,
            points=[[first + i, round(float(p.loss), 6)] for i, p in enumerate(r.losses)],
            **({"learning_rates": rates} if any(p.learning_rate for p in r.losses) else {}),
        )

    def _task_done(self, r: pb.ProgressReport) -> None:
        job = self._job
        assignment = job.queue.finish(r.task_id)
        if assignment is None:
            return
        task = assignment.task
        if task.kind == TRAINING:
            if r.HasField("timing"):
                t = r.timing
                job.journal.append(
                    EventKind.WORKER_TIME,
                    worker=r.worker_id,
                    task=r.task_id,
                    minibatches=t.minibatches,
                    task_s=round(t.task_seconds, 6),
                    compute_s=round(t.compute_seconds, 6),
                    wait_s=round(t.wait_seconds, 6),
                    **({"stale": t.stale} if t.stale else {}),
                )
                job.stragglers.check()
            job.journal.append(EventKind.PROGRESS, **job.progress_fields())
        elif task.kind == EVALUATION:
            job.evaluations.add(task.eval_round, r.worker_id, metric_states(r.metric_states))
        elif task.kind == PREDICTION:
            job.journal.append(
                EventKind.PREDICTION_TASK,
                worker=r.worker_id,
                source=task.source,
                start=task.start,
                records=task.end - task.start,
            )
        elif task.kind == EXPORT:
            if r.exported_tables:  # (too large for a Keras file)
                job.journal.append(
                    EventKind.EXPORT, path=r.exported_tables, worker=r.worker_id, tables=True
                )
            else:
                saved = {"saved_model": task.saved_model_path} if task.saved_model_path else {}
                job.journal.append(
                    EventKind.EXPORT, path=task.export_path, worker=r.worker_id, **saved
                )
