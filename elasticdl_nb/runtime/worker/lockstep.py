"""An allreduce worker: synchronous steps with the other members of the group, which
shrinks on a failure and grows on a join without anyone restarting.

A step: take this member's next minibatch (or none), compute its gradients, then one
ring allreduce of [gradients × records, the step's table]. The table has a row per rank
(`step_table.py`): the minibatch the rank contributed, its record count and loss, the
newest group version it heard of, whether it heard the job is over, and whether it is
about to evaluate or export (a slow step). Everyone gets the same sums, so everyone
applies the same update, keeps the same ledger of applied minibatches, and makes the
same decisions after the step: switch to a newer version, stop, or wait longer for the
next step.

After a `PeerLost` the member reports to the master and gets the `Recovery` every
survivor gets (runtime/collective/membership.py): the one step behind receive that
step's sums from the source and apply them, then all continue in the new ring; the
minibatch of a step that did not complete is trained again.

A step's minibatches are reported to the master once the next step has completed (then
every member has applied it); see runtime/master/allreduce_group.py for why.

The group itself (entering it, the ring, the newest version, handing the model to a
newcomer, the master's recovery plan and a step's sums to a member behind) is the
member's `GroupLink` (group_link.py); `Lockstep` decides when: before the first step, at
a step boundary where someone heard of a newer version, and after a `PeerLost`.

Every `checkpoint_steps` steps the group's first member checkpoints its replica off the
step's path (runtime/collective/checkpoints.py), with the minibatches it holds (every
member keeps that record, and a joiner gets it with the model); a group formed after every
replica was lost starts from the newest one.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from elasticdl_nb.model import load_bundle
from elasticdl_nb.model.contract import Mode
from elasticdl_nb.model.metrics import take_metric_states
from elasticdl_nb.runtime.collective import checkpoints
from elasticdl_nb.runtime.collective.checkpoints import Applied, CheckpointWriter
from elasticdl_nb.runtime.collective.ring import Group, PeerLost
from elasticdl_nb.runtime.process_env import ProcessEnv
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.worker import step_table
from elasticdl_nb.runtime.worker.batches import Batch, BatchMaker, first_batch
from elasticdl_nb.runtime.worker.export import export_model
from elasticdl_nb.runtime.worker.group_link import GroupLink, group_of
from elasticdl_nb.runtime.worker.prediction import TaskPredictions
from elasticdl_nb.runtime.worker.replica import Replica
from elasticdl_nb.runtime.worker.replica_records import ReplicaRecords
from elasticdl_nb.runtime.worker.reporter import Reporter
from elasticdl_nb.runtime.worker.step_table import Row, new_table, put_minibatch
from elasticdl_nb.runtime.worker.task_feed import TaskFeed
from elasticdl_nb.vocabulary import GroupChange

log = logging.getLogger("elasticdl_nb.worker")


# How long a member waits for a neighbour's data before it counts the neighbour as hung
# (a dead one is noticed at once: its connections reset). Tied to the observed step time.
DEADLINE_STEPS, DEADLINE_FLOOR = 25, 2.0
SLOW_STEP_SECONDS = 300.0  # a step after which someone evaluates, exports, or joins


@dataclass
class Minibatch:
    task: pb.Task
    batch: Batch
    last_of_task: bool


@dataclass
class StepRecord:
    """A completed step, until it is reported to the master."""

    step: int
    minibatches: list[tuple[int, int]]  # (task id, start) of every rank's minibatch
    loss: float | None
    learning_rate: float
    tasks_done: list[tuple[pb.Task, pb.TaskTiming]] = field(default_factory=list)


class Lockstep:
    def __init__(self, env: ProcessEnv, worker_id: int, master: rpc.MasterStub, reporter: Reporter):
        self.env, self.me, self.master, self.reporter = env, worker_id, master, reporter
        self.spec = env.files.read_spec()
        contract = load_bundle(env.files.bundle)
        self.replica = Replica(contract)
        sources = env.load_sources()
        self.train_batches = BatchMaker(sources["train"], contract, self.spec)
        self.eval_batches = BatchMaker(sources["validation"], contract, self.spec)
        self.predictions = TaskPredictions(
            BatchMaker(sources.get("prediction", []), contract, self.spec), contract, worker_id
        )
        self.link = GroupLink(env, worker_id, master)  # the group, its ring, the transfers
        self.step = 0  # the last step this replica applied
        self.held: tuple[int, np.ndarray, np.ndarray] | None = None  # last step's sums
        self.unreported: deque[StepRecord] = deque()
        self.step_seconds: deque[float] = deque(maxlen=50)
        self._rate, self._rate_set = 0.0, 0  # the newest rate set by callbacks (tasks carry it)
        self._slow_next = True  # the first step of a ring waits long (tracing, joiners)
        self._minibatches: Iterator[Minibatch] | None = None
        self._pending: Minibatch | None = None  # taken for a step that has not completed
        self._special: pb.Task | None = None  # an evaluation or export, after this step
        self._task_timing: dict[int, pb.TaskTiming] = {}
        self._zeros: np.ndarray | None = None
        self._idle = 0.0  # the current back-off between steps nobody had work for
        self.feed: TaskFeed | None = None
        self.records = ReplicaRecords(env.job_dir, worker_id, self.spec.record_ledger)
        self.applied = Applied(self.spec.minibatch_size)  # what this replica's state holds
        self.checkpoints = CheckpointWriter(
            env.files.checkpoints,
            self.spec.checkpoint_steps,
            self.spec.keep_checkpoints,
            worker_id,
        )

    # ================================================================== the loop

    def run(self) -> None:
        self._build()
        self._enter()
        self.feed = TaskFeed(self.master, self.me)
        self.link.poll_versions()
        try:
            self._steps()
        finally:
            self.feed.close()
            self.link.close()

    def _steps(self) -> None:
        while True:
            mb = self._pending or self._take_minibatch()
            self._pending = mb
            try:
                table = self._one_step(mb)
            except PeerLost as exc:
                self._recover(exc)
                continue
            self._minibatch_applied()
            self._report_settled()
            if table[:, Row.FINISHED].max() > 0:
                self._finish("the job is over")
                return
            if self._special is not None:
                task, self._special = self._special, None
                self._run_special(task)
            newest = int(table[:, Row.VERSION].max())
            if newest > self.link.group.version:
                if not self._switch(newest):
                    return  # this member left the group
            elif table[:, Row.COUNT].sum() == 0:
                # Nobody had work (the master is between epochs): back off, 1 ms doubling
                # up to 20 ms, so that idle steps do not spin.
                self._idle = min(0.02, self._idle * 2 or 0.001)
                time.sleep(self._idle)
            else:
                self._idle = 0.0

    # ================================================================== one step

    def _take_minibatch(self) -> Minibatch | None:
        """This member's next minibatch, or None; an evaluation or export task is kept
        for after the step (and the step tells the group it will be slow)."""
        while self._special is None:
            if self._minibatches is None:
                task = self.feed.next()
                if task is None:
                    return None
                if task.type != pb.TRAINING:
                    self._special = task
                    return None
                if task.learning_rate_set > self._rate_set:
                    self._rate, self._rate_set = task.learning_rate, task.learning_rate_set
                self._minibatches = self._training(task)
            mb = next(self._minibatches, None)
            if mb is not None:
                return mb
            self._minibatches = None
        return None

    def _training(self, task: pb.Task) -> Iterator[Minibatch]:
        r = task.range
        batches = self.train_batches.batches(r.source, r.start, r.end, Mode.TRAINING)
        self._task_timing[task.task_id] = pb.TaskTiming()
        batch = next(batches, None)
        while batch is not None:
            following = next(batches, None)
            yield Minibatch(task, batch, following is None)
            batch = following

    def _one_step(self, mb: Minibatch | None) -> np.ndarray:
        group, step = self.link.group, self.step + 1
        t0 = time.perf_counter()
        table = new_table(group.size)
        row = table[group.rank_of(self.me)]
        if mb is None:
            if self._zeros is None:
                self._zeros = np.zeros(self.replica.size, np.float32)
            grads = self._zeros
        else:
            loss, grads = self.replica.gradients(mb.batch.features, mb.batch.labels)
            put_minibatch(row, mb.task, mb.batch, len(np.asarray(mb.batch.labels)), loss)
        t1 = time.perf_counter()
        row[Row.VERSION] = self.link.latest
        row[Row.FINISHED] = float(self.feed.finished.is_set() and mb is None)
        row[Row.SLOW] = float(self._special is not None)
        row[Row.RATE], row[Row.RATE_SET] = self._rate, self._rate_set
        timeout = self._deadline()
        summed, table = self.link.ring.allreduce([grads, table], step, timeout)
        t2 = time.perf_counter()
        if mb is not None:  # (compute: the gradients; wait: the allreduce)
            timing = self._task_timing[mb.task.task_id]
            timing.minibatches += 1
            timing.compute_seconds += t1 - t0
            timing.wait_seconds += t2 - t1
            timing.task_seconds += t2 - t0
        self._apply(step, summed, table, mb)
        self._slow_next = table[:, Row.SLOW].max() > 0
        if table[:, Row.COUNT].sum() > 0:
            self.step_seconds.append(t2 - t0)
        return table

    def _deadline(self) -> float:
        if self._slow_next or len(self.step_seconds) < 5:
            return SLOW_STEP_SECONDS
        return max(DEADLINE_FLOOR, DEADLINE_STEPS * statistics.median(self.step_seconds))

    def _apply(
        self, step: int, summed: np.ndarray, table: np.ndarray, mb: Minibatch | None
    ) -> None:
        """The group's update for `step`, the same on every replica, exactly once; `mb`:
        this member's minibatch in it."""
        records = float(table[:, Row.COUNT].sum())
        newest = table[int(table[:, Row.RATE_SET].argmax())]
        if newest[Row.RATE_SET] > self._rate_set:  # (a member got a newer setting first)
            self._rate, self._rate_set = float(newest[Row.RATE]), int(newest[Row.RATE_SET])
        given = float(newest[Row.RATE]) if newest[Row.RATE_SET] > 0 else None
        rate = self.replica.apply(summed / records, given) if records > 0 else 0.0
        self.step = step
        self.held = (step, summed, table)
        minibatches, ledger = step_table.minibatches(table)
        self.records.applied(step, ledger)  # every replica keeps the whole ledger
        self.applied.add(ledger)
        if self.link.leads:
            version = self.link.group.version
            self.checkpoints.maybe_save(step, version, self.replica.state, self.applied)
        loss = float(table[:, Row.LOSS].sum() / records) if records > 0 else None
        record = StepRecord(step, minibatches, loss, rate)
        if mb is not None and mb.last_of_task:
            record.tasks_done.append((mb.task, self._task_timing.pop(mb.task.task_id)))
        self.unreported.append(record)
        self._report_through(step - 1)

    def _minibatch_applied(self) -> None:
        """The pending minibatch is in an applied step: take the next one next time."""
        if self._pending is not None and self._pending.last_of_task:
            self._minibatches = None
        self._pending = None

    # ================================================================== reports

    def _report_through(self, step: int) -> None:
        """Tell the master about every step up to `step` (all members applied them)."""
        first = self.link.leads  # one member reports the loss
        while self.unreported and self.unreported[0].step <= step:
            record = self.unreported.popleft()
            by_task: dict[int, list[int]] = {}
            for task_id, start in record.minibatches:
                by_task.setdefault(task_id, []).append(start)
            for task_id, starts in by_task.items():
                self.reporter.applied(task_id, starts)
            if first and record.loss is not None:
                self.reporter.step_loss(record.loss, record.learning_rate)
            for task, timing in record.tasks_done:
                self.reporter.task_done(task.task_id, timing=timing, wait=False)

    def _report_settled(self) -> None:
        change = self.link.settled()
        if change is not None and self.link.leads:
            since, cause = change
            version = self.link.group.version
            self.reporter.settled(version, self.step, time.monotonic() - since, cause)
            log.info(
                "group %d (%s) settled: step %d, %.3f s after the change",
                version, cause, self.step, time.monotonic() - since,
            )  # fmt: skip

    # ================================================================== group changes

    def _enter(self) -> None:
        """Enter the group: start it (from nothing, or from the replicas' checkpoint) and
        send the model to whoever enters with us, or receive the model from a member."""
        info = self.link.join()
        group = group_of(info)
        self.link.changed(GroupChange.FORMED if info.state_from >= 0 else GroupChange.JOINED)
        if info.state_from == self.me:  # a group formed from nothing starts from us
            if info.restore:
                self._restore(Path(info.restore))
            self._send_state(group, old_members={self.me})
        else:
            group = self.link.fetch(self._receive_state())
        try:
            self._connect(group)
        except PeerLost as exc:  # it holds the model now: it recovers like the others
            self._recover(exc)
        self._record("entered")

    def _connect(self, group: Group) -> None:
        self.link.connect(group)
        self._slow_next = True
        self._scale_learning_rate()

    def _switch(self, version: int) -> bool:
        """Move to group `version` after the step all members just completed; False if
        this member is not in it (it leaves)."""
        old = self.link.group
        new = self.link.fetch(version, timeout=30)
        old_ids, new_ids = {w for w, _ in old.members}, {w for w, _ in new.members}
        self.link.changed(GroupChange.JOINED if new_ids - old_ids else GroupChange.LEFT)
        if self.me not in new_ids:
            self._report_through(self.step)
            self._finish(f"left the group at version {version}")
            return False
        try:
            self._send_state(new, old_ids)
            self._connect(new)
        except PeerLost as exc:
            self._recover(exc)
            return True
        self._record("switched")
        return True

    def _send_state(self, group: Group, old_members: set[int]) -> None:
        """The replica to the members of `group` not in `old_members`, if this member
        is the one to send it (`GroupLink.send_state`)."""
        self.link.send_state(
            group,
            old_members,
            lambda: [np.array(self.step, np.int64), self.applied.to_bytes(), *self.replica.state()],
        )

    def _receive_state(self) -> int:
        """Take the model a member sends; returns the group version it was sent for."""
        version, arrays = self.link.receive_state()
        self.step = int(arrays[0])
        self.applied = Applied.from_bytes(self.spec.minibatch_size, arrays[1])
        self.replica.set_state(arrays[2:])
        log.info("got the model at step %d for group %d", self.step, version)
        return version

    def _restore(self, path: Path) -> None:
        """Every replica was lost: start from their checkpoint at `path`."""
        checkpoint = checkpoints.read(path, self.spec.minibatch_size)
        self.replica.set_state(checkpoint.arrays())
        self.step, self.applied = checkpoint.step, checkpoint.applied
        log.info("restored the replicas' checkpoint of step %d (%s)", self.step, path.name)

    # ================================================================== recovery

    def _recover(self, lost: PeerLost) -> None:
        """Agree on the survivors with the master, bring this replica to the agreed step,
        and connect the new ring; again if another member is lost meanwhile."""
        since = time.monotonic()
        while True:
            try:
                self._recover_once(lost, since)
                return
            except PeerLost as again:
                lost = again

    def _recover_once(self, lost: PeerLost, since: float) -> None:
        log.warning("group %d broke at step %d: %s", self.link.group.version, self.step + 1, lost)
        self.link.close_ring()
        self.reporter.flush()  # the master has everything reported before it decides
        unreported = [
            pb.StepMinibatch(step=r.step, task_id=t, start=s)
            for r in self.unreported
            for t, s in r.minibatches
        ]
        holds_result = self.held is not None and self.held[0] == self.step
        plan = self.link.report_lost(lost, self.step, holds_result, unreported)
        new = self.link.group
        if self.me in plan.behind:
            # The step that broke here completed elsewhere, with this member's minibatch.
            self._apply(*self.link.receive_result(plan, self.step + 1), self._pending)
            self._minibatch_applied()
        elif self.me == plan.source:
            self.link.send_result(plan, self.held)
        self._report_through(plan.step)
        self.link.changed(GroupChange.FAILURE, since)
        self._send_state(new, {w for w, _ in new.members} - set(plan.joiners))
        self._connect(new)
        self._record("recovered")

    def _scale_learning_rate(self) -> None:
        if self.spec.lr_scaling == "linear":
            self.replica.scale_learning_rate(self.link.group.size / self.spec.workers)

    # ================================================================== tasks between steps

    def _run_special(self, task: pb.Task) -> None:
        if task.type == pb.EVALUATION:
            r = task.range
            for batch in self.eval_batches.batches(r.source, r.start, r.end, Mode.EVALUATION):
                self.replica.eval_step(batch.features, batch.labels)
            states = take_metric_states(self.replica.metrics)
            self.reporter.task_done(task.task_id, states, wait=False)
        elif task.type == pb.PREDICTION:
            self.predictions.run(task, self.replica.predict)
            self.reporter.task_done(task.task_id, wait=False)
        elif task.type == pb.EXPORT:
            export_model(self.replica.model, task, self.me)
            self.reporter.task_done(task.task_id, wait=False)

    # ================================================================== start and end

    def _build(self) -> None:
        """Build the replica and trace its step before joining: a member that joins a
        running group would otherwise make everyone wait for its tracing on its first
        step. The trial update is undone (the state a member trains from comes from the
        group, or is its own as built)."""
        first = first_batch(self.train_batches, Mode.TRAINING)
        self.replica.build(first.features)
        built = self.replica.state()
        _, grads = self.replica.gradients(first.features, first.labels)
        self.replica.apply(np.zeros_like(grads))
        self.replica.set_state(built)

    def _record(self, event: str) -> None:
        """The replica's checksum at this step, for comparing replicas across workers."""
        self.records.checksum(
            event, self.link.group.version, self.step, self.replica.checksum(),
            self.replica.learning_rate(),
        )  # fmt: skip

    def _finish(self, why: str) -> None:
        self._report_through(self.step)
        self.checkpoints.close()
        if copies := self.checkpoints.copy_seconds:
            log.info(
                "replica checkpoints taken: %d; the state copy on the step: median %.3f ms",
                len(copies), 1000 * statistics.median(copies),
            )  # fmt: skip
        self._record("end")
        self.reporter.flush()
        log.info("worker %d stops at step %d: %s", self.me, self.step, why)
