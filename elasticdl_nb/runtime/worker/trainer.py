"""What a worker does with each task: the training loop, evaluation, export.

One round trip per shard per minibatch: the push of minibatch i travels in the same call
as the pull for minibatch i+1 (whose embedding ids are probed first), and the PS applies
the push before it answers the pull, so parameters are exactly as fresh as with a
separate push and pull.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from elasticdl_nb.data import DataError
from elasticdl_nb.model import load_bundle
from elasticdl_nb.model.contract import Mode
from elasticdl_nb.model.metrics import take_metric_states
from elasticdl_nb.runtime.process_env import ProcessEnv
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.patience import PeerUnreachable, WrongPeer
from elasticdl_nb.runtime.table_export import write_dense
from elasticdl_nb.runtime.worker.batches import BatchMaker, first_batch
from elasticdl_nb.runtime.worker.export import (
    WHOLE_TABLES_MAX_BYTES,
    export_model,
    note_not_exported,
    whole_tables_bytes,
)
from elasticdl_nb.runtime.worker.model_runner import ModelRunner
from elasticdl_nb.runtime.worker.prediction import TaskPredictions
from elasticdl_nb.runtime.worker.ps_client import PsClient, PushPayload
from elasticdl_nb.runtime.worker.reporter import Reporter

log = logging.getLogger("elasticdl_nb.worker")


class UserCodeError(RuntimeError):
    """The model, its functions or the data failed; retrying elsewhere will not help."""


def user_code_error(exc: BaseException) -> UserCodeError:
    import traceback

    return UserCodeError("".join(traceback.format_exception(exc)).strip())


@dataclass
class _Computed:
    """A minibatch's gradients, computed and not yet sent, and the task they belong to."""

    task: pb.Task
    push: PushPayload
    loss: float
    timing: pb.TaskTiming  # the task's, reported with its task_done
    ends_task: bool = False  # the task's last minibatch: its push completes the task


class _TaskPass:
    """One asynchronous training task's pass over its minibatches: the window of those
    read ahead (`window`: [batch, its ids or None], the current one first), each step's
    train call, which probes the ids of the minibatch `ahead` steps on, and where the
    task's time went (`timing`)."""

    def __init__(self, trainer: Trainer, task: pb.Task, ahead: int):
        self.task, self.ahead, self._trainer = task, ahead, trainer
        r = task.range
        self._source = trainer.train_batches.batches(r.source, r.start, r.end, Mode.TRAINING)
        self.window: deque[list] = deque()
        self.timing = pb.TaskTiming()
        self.started = time.perf_counter()

    def fill(self) -> None:
        while len(self.window) <= self.ahead:
            batch = next(self._source, None)
            if batch is None:
                return
            self._trainer._ensure_built(batch.features, batch.labels)
            self.window.append([batch, None])

    def read_ahead(self) -> None:
        """Fill the window, and probe the ids of the first `ahead` minibatches (no step
        before them did)."""
        self.fill()
        for entry in list(self.window)[: self.ahead]:
            entry[1] = self._trainer.runner.probe_ids(entry[0].features)

    def reply(self, handle):
        """The PS's answer to an exchange, the wait for it counted in the task's time."""
        t0 = time.perf_counter()
        answer = handle.result()
        self.timing.wait_seconds += time.perf_counter() - t0
        return answer

    def step(self, batch, dense, rows) -> _Computed:
        """Train on `batch` with the parameters an exchange brought."""
        target = self.window[self.ahead - 1] if len(self.window) >= self.ahead else None
        t0 = time.perf_counter()
        grads = self._trainer.runner.train_step(
            batch.features, batch.labels, dense, rows, target[0].features if target else None
        )
        self.timing.compute_seconds += time.perf_counter() - t0
        self.timing.minibatches += 1
        if target:
            target[1] = grads.next_ids
        push = self._trainer._payload(self.task, batch, grads)
        return _Computed(self.task, push, grads.loss, self.timing)


class Trainer:
    """A parameter-server job's worker: runs each task it is given (`run`) against the
    PS through its `PsClient`."""

    def __init__(
        self,
        env: ProcessEnv,
        worker_id: int,
        reporter: Reporter,
        locate_ps: Callable[[], Sequence[str]],
    ):
        self.env, self.worker_id, self.reporter = env, worker_id, reporter
        self.spec = env.files.read_spec()
        sources = env.load_sources()
        try:
            contract = load_bundle(env.files.bundle)
            self.runner = ModelRunner(contract)
        except Exception as exc:
            raise user_code_error(exc) from exc
        self.train_batches = BatchMaker(sources["train"], contract, self.spec)
        self.eval_batches = BatchMaker(sources["validation"], contract, self.spec)
        self.predictions = TaskPredictions(
            BatchMaker(sources.get("prediction", []), contract, self.spec), contract, worker_id
        )
        self.ps = PsClient(locate_ps, env.token, tls=env.tls, on_outage=reporter.outage)
        # The last push of the previous training task: it travels with the first pull of
        # the next one (exact mode), so a task boundary costs no extra round trip.
        self._unsent: _Computed | None = None

    def run(self, task: pb.Task) -> None:
        try:
            if task.type == pb.TRAINING:
                self._train(task)
            elif task.type == pb.EVALUATION:
                self._evaluate(task)
            elif task.type == pb.PREDICTION:
                self.predictions.run(task, self._predict)
                self.reporter.task_done(task.task_id)
            elif task.type == pb.EXPORT:
                self._export(task)
        except (grpc.RpcError, PeerUnreachable, WrongPeer):
            raise  # infrastructure: exit non-zero (process.py says which code)
        except (DataError, Exception) as exc:
            raise user_code_error(exc) from exc

    def prepare(self) -> None:
        """Get ready before the first task: the model built on the training data's first
        minibatch, its step traced and run once, its values offered to the PS. A standby
        worker is then ready the moment it takes a lost worker's place, and any worker's
        first task runs at the speed of the others'. Logs when each part was done: where
        a new worker's (a new pod's) start goes."""
        began, done = time.monotonic(), {}

        def mark(what: str) -> None:
            done[what] = time.monotonic() - began

        try:
            batch = first_batch(self.train_batches, Mode.TRAINING)
            mark("first minibatch read")
            self._ensure_built(batch.features, batch.labels, warm_up=True, mark=mark)
        except (grpc.RpcError, PeerUnreachable, WrongPeer):
            raise  # infrastructure: exit non-zero (process.py says which code)
        except (DataError, Exception) as exc:
            raise user_code_error(exc) from exc
        log.info("ready: %s", ", ".join(f"{what} at {t:.2f} s" for what, t in done.items()))

    def _ensure_built(
        self,
        features,
        labels=None,
        warm_up: bool = False,
        mark: Callable[[str], None] = lambda what: None,
    ) -> None:
        """Build the model on the first minibatch and offer its initial values to the PS.
        Given a training minibatch's labels, the train step is traced meanwhile (and, with
        `warm_up`, run once: that needs nothing of the PS): the PS prepares its side (its
        optimizer's step) while this worker traces its own, about half a second each, so
        a new worker's first step comes that much sooner. `mark` is told each part's end."""
        if self.runner.built:
            if warm_up and labels is not None:
                self.runner.warm_up(features, labels)
            return
        self.runner.build(features)
        self.ps.set_model(self.runner.variable_values(), self.runner.table_defs)
        seeds = self.runner.take_table_seeds()
        mark("model built")
        if labels is None:
            self.ps.initialize(seeds=seeds)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="ps-init") as background:
            initialized = background.submit(self.ps.initialize, seeds=seeds)
            self.runner.prepare_train(features, labels)
            mark("step traced")
            if warm_up:
                self.runner.warm_up(features, labels)
                mark("step run once")
            initialized.result()
            mark("PS initialized")

    def _pull(self, features) -> dict:
        """Load the dense parameters a step on `features` needs into the model, and return
        its rows (evaluation)."""
        return self._loaded(self._start(None, self.runner.probe_ids(features)).result())

    def _loaded(self, answer: tuple) -> dict:
        """Put an exchange's dense values (if any) into the model; returns its rows. Every
        reply that does not go into a train step comes through here: once read, its
        values count as held (`PendingExchange.result`) and are not sent again."""
        dense, rows = answer
        self.runner.load(dense)
        return rows

    # ------------------------------------------------------------------ tasks

    def _train(self, task: pb.Task) -> None:
        """Train on every minibatch of the task, in the job's mode: synchronous (a PS
        waits for `grads_to_wait` gradients per version), overlapped, or exact.

        In the two asynchronous modes each step's push travels with the pull for a later
        step: the next one (exact), or, with `overlap_communication`, the one after, sent
        before this step computes so the PS works meanwhile (parameters are then one
        update old). The ids a pull needs are probed `ahead` minibatches early, inside
        the train call of an earlier step (`_TaskPass`).
        """
        if self.spec.grads_to_wait:
            self._train_synchronously(task)
        elif self.spec.overlap_communication:
            self._train_overlapped(task)
        else:
            self._train_exact(task)

    def _train_exact(self, task: pb.Task) -> None:
        """Each step's pull carries the previous step's push. The task's last push stays
        unsent (`_unsent`) until the next task's first pull or `flush_unsent`; the task is
        reported done once it is applied."""
        run = _TaskPass(self, task, ahead=1)
        run.read_ahead()
        last, self._unsent = self._unsent, None  # computed, not yet sent
        while run.window and not self.reporter.stop_requested.is_set():
            batch, ids = run.window.popleft()
            handle, carried = self._start(last.push if last else None, ids), last
            run.fill()  # (the next minibatch is read while the PS works)
            dense, rows = run.reply(handle)
            if carried:
                self._applied(carried, handle)
            last = run.step(batch, dense, rows)
        self._task_trained(run, last, flush=False)

    def _train_overlapped(self, task: pb.Task) -> None:
        """Each step's push goes out with the pull for the step after next, before this
        step computes; the task ends with its last exchange answered and its last push
        sent (a task boundary empties the pipeline)."""
        run = _TaskPass(self, task, ahead=2)
        self.flush_unsent()
        run.read_ahead()
        in_flight = None  # (exchange on its way, the push it carries)
        if run.window:
            in_flight = (self._start(None, run.window[0][1]), None)
        last = None  # computed, not yet sent
        while run.window and not self.reporter.stop_requested.is_set():
            batch, _ = run.window.popleft()
            run.fill()
            handle, carried = in_flight
            dense, rows = run.reply(handle)
            following = run.window[0][1] if run.window else {}
            in_flight = (self._start(last.push if last else None, following), last)
            if carried:
                self._applied(carried, handle)
            last = run.step(batch, dense, rows)
        if in_flight is not None:
            handle, carried = in_flight
            self._loaded(run.reply(handle))  # (the next task starts from them)
            if carried:
                self._applied(carried, handle)
        self._task_trained(run, last, flush=True)

    def _task_trained(self, run: _TaskPass, last: _Computed | None, flush: bool) -> None:
        """The end of an asynchronous task's pass: its last push, `last`, is kept unsent
        for the next task's first pull, or sent now if `flush` or the worker is stopping.
        A task none of whose minibatches was computed is done at once."""
        run.timing.task_seconds = time.perf_counter() - run.started
        stopping = self.reporter.stop_requested.is_set()
        if last is None or last.task is not run.task:  # no minibatch of this task was computed
            self._unsent = last  # (the previous task's, if the loop never ran)
            if not stopping:
                self.reporter.task_done(run.task.task_id, timing=run.timing, wait=False)
            return
        last.ends_task = True
        self._unsent = last
        if flush or stopping:
            self.flush_unsent()

    def flush_unsent(self) -> bool:
        """Send the unsent last push of the previous training task, if there is one (before
        anything that is not the next training task); returns whether there was one."""
        computed, self._unsent = self._unsent, None
        if computed is None:
            return False
        # What comes back keeps the local model current.
        handle = self._start(computed.push, {})
        self._loaded(handle.result())
        self._applied(computed, handle, wait=True)
        return True

    def _train_synchronously(self, task: pb.Task) -> None:
        """Train on every minibatch of the task with `grads_to_wait` (synchronous PS):
        pull the newest parameters, compute, push; a shard that refuses the gradients as
        computed on an older version sends the newer parameters back, and the minibatch
        is computed again on them (its other shards drop the repeat as a duplicate). Two
        round trips a minibatch: a push cannot ride with the next pull, since a refused
        one must be computed again before the next minibatch."""
        r = task.range
        timing, t_task = pb.TaskTiming(), time.perf_counter()
        for batch in self.train_batches.batches(r.source, r.start, r.end, Mode.TRAINING):
            if self.reporter.stop_requested.is_set():
                return
            self._ensure_built(batch.features, batch.labels)
            ids = self.runner.probe_ids(batch.features)
            while True:
                t0 = time.perf_counter()
                dense, rows = self._start(None, ids).result()
                t1 = time.perf_counter()
                grads = self.runner.train_step(batch.features, batch.labels, dense, rows)
                t2 = time.perf_counter()
                payload = self._payload(task, batch, grads, list(self.ps.versions))
                handle = self._start(payload, {})
                # The version this push completed, or the newer one a stale push is sent
                # back: the next computation (this minibatch again, or the next) is on it.
                self._loaded(handle.result())
                timing.wait_seconds += (t1 - t0) + (time.perf_counter() - t2)
                timing.compute_seconds += t2 - t1
                timing.minibatches += 1
                if not handle.stale:
                    break
                timing.stale += 1
                log.debug(
                    "minibatch %d stale on PS %s: computing it again", batch.start, handle.stale
                )
            self._batch_pushed(task, payload, grads.loss, handle)
        timing.task_seconds = time.perf_counter() - t_task
        self.reporter.task_done(task.task_id, timing=timing, wait=False)

    def _payload(self, task: pb.Task, batch, grads, versions: list[int] | None = None):
        """What a minibatch's push carries (`versions`: those its gradients were computed
        on, for a synchronous PS)."""
        return PushPayload(
            task.epoch,
            task.range.source,
            batch.start,
            batch.end,
            grads.dense,
            grads.tables,
            self.spec.record_ledger,
            versions=versions,
            learning_rate=task.learning_rate,
        )

    def _applied(self, computed: _Computed, handle, wait: bool = False) -> None:
        """A push went through (`handle`, its exchange): report its minibatch, and its
        task if it was the last."""
        self._batch_pushed(computed.task, computed.push, computed.loss, handle)
        if computed.ends_task and not self.reporter.stop_requested.is_set():
            self.reporter.task_done(computed.task.task_id, timing=computed.timing, wait=wait)

    def _start(self, push: PushPayload | None, ids: dict):
        return self.ps.start_exchange(push, ids, self.runner.variable_values)

    def _batch_pushed(self, task: pb.Task, push: PushPayload, loss: float, handle) -> None:
        rate = handle.learning_rates[0] if handle.learning_rates else 0.0
        self.reporter.batch_done(task.task_id, push.batch_start, loss, list(self.ps.versions), rate)

    def _evaluate(self, task: pb.Task) -> None:
        r = task.range
        for batch in self.eval_batches.batches(r.source, r.start, r.end, Mode.EVALUATION):
            self._ensure_built(batch.features)
            rows = self._pull(batch.features)
            self.runner.eval_step(batch.features, batch.labels, rows)
        self.reporter.task_done(task.task_id, take_metric_states(self.runner.metrics))

    def _predict(self, features):
        """The model's outputs on `features`, with the newest parameters of the PS."""
        self._ensure_built(features)
        return self.runner.forward(features, self._pull(features))

    def _export(self, task: pb.Task) -> None:
        features = first_batch(self.train_batches, Mode.TRAINING).features
        self._ensure_built(features)
        if whole_tables_bytes(self.runner.table_defs) > WHOLE_TABLES_MAX_BYTES:
            # Too large for one file: each PS writes its rows, this worker the dense part.
            embeddings = Path(task.export_path or task.saved_model_path).with_name("embeddings")
            self.ps.export_tables(str(embeddings))
            self.ps.exchange(None, {}, self.runner.variable_values)  # the newest dense values
            write_dense(embeddings, dict(self.ps.dense_values))
            note_not_exported(task, self.runner.table_defs, embeddings)
            self.reporter.task_done(task.task_id, exported_tables=str(embeddings))
            return
        dense, rows = self.ps.exchange(None, {}, self.runner.variable_values, pull_all=True)
        tables = {name: table for name, (_, table) in rows.items()}
        model = self.runner.full_model(features, dense, tables)
        export_model(model, task, self.worker_id)
        self.reporter.task_done(task.task_id)
