"""Dynamic sharding: the data cut into tasks, handed to workers, tracked per minibatch.

A training task is a contiguous record range of one source, `minibatch_size ×
minibatches_per_task` records long, aligned to minibatch boundaries so that a minibatch
is always identified by (epoch, source, start offset). Workers report the minibatches
whose gradients every PS accepted; when a worker is lost, the minibatches of its task
that it had not reported go back to the front of the queue. Since every PS drops a
minibatch it has already applied, work that is done twice is applied once.

Every change to the queue is a call of one of its `@recorded` methods, and each such call
is handed, with its arguments, to the queue's `record` (the master journals it) before
the caller gets the result. The queue is deterministic, so a new master that makes the
same calls in the same order (`replay`) holds the same tasks, ids, assignments and done
sets as the one that died.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.predictions import task_file
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb

TRAINING, EVALUATION, EXPORT, PREDICTION = pb.TRAINING, pb.EVALUATION, pb.EXPORT, pb.PREDICTION


@dataclass
class Task:
    task_id: int
    kind: int
    source: int = 0
    start: int = 0
    end: int = 0
    epoch: int = 0
    eval_round: int = -1
    export_path: str = ""  # export tasks: the .keras file ("" = none)
    saved_model_path: str = ""  # and the SavedModel's folder ("" = none)
    output_path: str = ""  # prediction tasks: the file of their predictions

    def to_message(self) -> pb.Task:
        return pb.Task(
            task_id=self.task_id,
            type=self.kind,
            epoch=self.epoch,
            eval_round=self.eval_round,
            export_path=self.export_path,
            saved_model_path=self.saved_model_path,
            output_path=self.output_path,
            range=pb.RecordRange(source=self.source, start=self.start, end=self.end),
        )


@dataclass
class Assignment:
    worker_id: int
    task: Task
    done_starts: set[int] = field(default_factory=set)


def batch_starts(start: int, end: int, batch: int) -> list[int]:
    return list(range(start, end, batch))


def recorded(method: Callable) -> Callable:
    """A `TaskQueue` method whose calls change the queue: each outermost call is recorded
    as {"op": name, its arguments, the caller's `tags`, "task": the id of a task it
    returns}. Calls it makes to other recorded methods are part of it, not records."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(self: TaskQueue, *args: Any, tags: dict | None = None, **kwargs: Any) -> Any:
        if self._inside or self.record is None:
            return method(self, *args, **kwargs)
        self._inside = True
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._inside = False
        entry = {"op": method.__name__}
        for name, value in signature.bind(self, *args, **kwargs).arguments.items():
            if name != "self":
                entry[name] = sorted(value) if isinstance(value, set | frozenset) else value
        if isinstance(result, Task):
            entry["task"] = result.task_id
        self.record({**entry, **(tags or {})})
        return result

    call.recorded = True
    return call


class TaskQueue:
    """Training, evaluation and prediction tasks, what each worker is doing, and what is
    done."""

    STATE = ("todo", "doing", "done", "done_count", "_next_id", "training_stopped", "_open")

    def __init__(
        self,
        train: list[SourceInfo],
        validation: list[SourceInfo],
        minibatch_size: int,
        minibatches_per_task: int,
        shuffle: bool,
        seed: int,
        prediction: list[SourceInfo] = (),
    ):
        self.train, self.validation, self.prediction = train, validation, list(prediction)
        self.batch = minibatch_size
        self.per_task = minibatch_size * minibatches_per_task
        self.shuffle, self.seed = shuffle, seed
        self.todo: deque[Task] = deque()
        # How many tasks of each (kind, epoch) are queued or handed out: what the
        # coordinator asks every turn, answered without a pass over an epoch's tasks.
        self._open: Counter[tuple[int, int]] = Counter()
        self.doing: dict[int, Assignment] = {}  # task_id -> assignment
        # (epoch, source) -> batch starts done; a whole epoch's is its source's one shared
        # frozenset (`_whole`), so a job of many epochs keeps one set per source, not one
        # per epoch (and a snapshot pickles it once).
        self.done: dict[tuple[int, int], set[int] | frozenset[int]] = {}
        self._wholes: dict[int, frozenset[int]] = {}
        self.done_count = 0  # minibatches in `done`, all epochs: the job's step
        self._next_id = 0
        self.record: Callable[[dict], None] | None = None  # (see the module docstring)
        self._inside = False
        self.training_stopped = False  # (a callback ended training: nothing is redone)

    def replay(self, entry: dict) -> dict:
        """Make a recorded call again (`entry` as `record` got it); returns the entry's
        tags (what the caller recorded besides the call). Raises if the queue does not
        answer as it did, which would mean the replay is not the same history."""
        method = getattr(type(self), entry["op"], None)
        if not getattr(method, "recorded", False):
            raise ValueError(f"not a recorded call of the task queue: {entry}")
        params = inspect.signature(method.__wrapped__).parameters
        args = {k: v for k, v in entry.items() if k in params and k != "self"}
        record, self.record = self.record, None
        try:
            result = method(self, **args)
        finally:
            self.record = record
        given = result.task_id if isinstance(result, Task) else None
        if given != entry.get("task"):
            raise ValueError(f"replayed {entry} gave task {given}: not the same history")
        return {k: v for k, v in entry.items() if k not in params and k not in ("op", "task")}

    # ------------------------------------------------------------------ making tasks

    def _new(self, **fields) -> Task:
        task = Task(task_id=self._next_id, **fields)
        self._next_id += 1
        return task

    def _cover(self, sources: list[SourceInfo], **fields) -> list[Task]:
        """Tasks that cover every record of `sources` once."""
        return [
            self._new(source=i, start=s, end=min(s + self.per_task, src.num_records), **fields)
            for i, src in enumerate(sources)
            for s in range(0, src.num_records, self.per_task)
        ]

    @recorded
    def add_epoch(self, epoch: int) -> int:
        """Queue the training tasks of one epoch; returns how many."""
        tasks = self._cover(self.train, kind=TRAINING, epoch=epoch)
        if self.shuffle:
            random.Random(self.seed * 100003 + epoch).shuffle(tasks)
        self.todo.extend(self._opened(tasks))
        for i in range(len(self.train)):
            self.done.setdefault((epoch, i), set())
        return len(tasks)

    @recorded
    def add_evaluation(self, eval_round: int) -> int:
        """Queue an evaluation round at the front: the model is judged as it is now."""
        tasks = self._cover(self.validation, kind=EVALUATION, eval_round=eval_round)
        self.todo.extendleft(reversed(self._opened(tasks)))
        return len(tasks)

    @recorded
    def add_prediction(self, directory: str) -> int:
        """Queue the prediction data's tasks, each writing its range's predictions to a
        file of its own under `directory` (`runtime/predictions.py`); returns how many."""
        tasks = self._cover(self.prediction, kind=PREDICTION)
        for task in tasks:
            task.output_path = str(task_file(Path(directory), task.source, task.start))
        self.todo.extend(self._opened(tasks))
        return len(tasks)

    @recorded
    def add_export(self, path: str, saved_model_path: str = "") -> None:
        """Queue the export: a Keras file at `path` and/or a SavedModel at
        `saved_model_path` (either may be "": not wanted)."""
        task = self._new(kind=EXPORT, export_path=path, saved_model_path=saved_model_path)
        self.todo.appendleft(self._opened([task])[0])

    @recorded
    def requeue_batches(
        self, epoch: int, source: int, starts: list[int], reason: str
    ) -> list[Task]:
        """Queue the given minibatches again (front of the queue), as tasks of contiguous
        runs; none once training was stopped (`stop_training`)."""
        if self.training_stopped:
            return []
        end_of_source = self.train[source].num_records
        tasks: list[Task] = []
        for run in _runs(sorted(starts), self.batch):
            for s in range(run[0], run[1], self.per_task):
                tasks.append(
                    self._new(
                        kind=TRAINING,
                        source=source,
                        start=s,
                        end=min(s + self.per_task, run[1], end_of_source),
                        epoch=epoch,
                    )
                )
        done = self._mutable_done(epoch, source)
        self.done_count -= len(done.intersection(starts))
        done.difference_update(starts)
        self.todo.extendleft(reversed(self._opened(tasks)))
        return tasks

    @recorded
    def stop_training(self) -> int:
        """Training ends early (a callback stopped it): drop the training tasks not
        handed out yet, and queue none again from now on. Returns how many were dropped."""
        before = len(self.todo)
        self.todo = deque(t for t in self.todo if t.kind != TRAINING or self._closed(t))
        self.training_stopped = True
        return before - len(self.todo)

    # ------------------------------------------------------------------ handing out

    @recorded
    def next_for(self, worker_id: int) -> Task | None:
        if not self.todo:
            return None
        task = self.todo.popleft()
        self.doing[task.task_id] = Assignment(worker_id, task)
        return task

    def holders(self) -> set[int]:
        """The workers that have a task handed out and not finished."""
        return {a.worker_id for a in self.doing.values()}

    def holds(self, worker_id: int) -> bool:
        """Whether the worker has a task handed out and not finished."""
        return any(a.worker_id == worker_id for a in self.doing.values())

    @recorded
    def report(self, task_id: int, starts: list[int]) -> list[int]:
        """Record reported minibatches; returns the ones that were not known done yet."""
        assignment = self.doing.get(task_id)
        if assignment is None:
            return []
        task = assignment.task
        if task.kind != TRAINING:
            return []
        done = self.done[(task.epoch, task.source)]
        fresh = sorted(set(starts) - done)  # (one report may name a minibatch twice)
        if fresh:
            self._mutable_done(task.epoch, task.source).update(fresh)
            self._share_if_whole(task.epoch, task.source)
        self.done_count += len(fresh)
        assignment.done_starts.update(starts)
        return fresh

    @recorded
    def finish(self, task_id: int) -> Assignment | None:
        assignment = self.doing.pop(task_id, None)
        if assignment is not None:
            self._closed(assignment.task)
        return assignment

    @recorded
    def release_worker(self, worker_id: int) -> list[tuple[Task, list[int]]]:
        """Take back a lost worker's tasks; returns (task, requeued batch starts) pairs."""
        released = []
        for task_id, assignment in list(self.doing.items()):
            if assignment.worker_id != worker_id:
                continue
            del self.doing[task_id]
            task = assignment.task
            self._closed(task)
            if task.kind == TRAINING:
                left = [
                    s
                    for s in batch_starts(task.start, task.end, self.batch)
                    if s not in assignment.done_starts
                ]
                if left:
                    self.requeue_batches(task.epoch, task.source, left, "worker lost")
                released.append((task, left))
            else:  # evaluation, prediction and export are redone whole
                self.todo.appendleft(self._opened([task])[0])
                released.append((task, []))
        return released

    # ------------------------------------------------------------------ progress

    def training_pending(self, epoch: int | None = None) -> bool:
        """Whether training tasks (of `epoch`, or of any epoch) are queued or running."""
        if epoch is not None:
            return self._open[(TRAINING, epoch)] > 0
        return any(kind == TRAINING for kind, _ in self._open)

    @recorded
    def rewind(self, held: list[tuple[int, int, list[int]]], last_epoch: int) -> int:
        """Every copy of the model is lost, back to one that holds `held` ((epoch, source,
        minibatch starts) triples): from now on exactly those minibatches of epochs up to
        `last_epoch` are done, and every other one is queued once (no training task is
        running: whoever ran one is lost). Returns how many minibatches are queued."""
        have = {(epoch, source): set(starts) for epoch, source, starts in held}
        self.todo = deque(
            t for t in self.todo if t.kind != TRAINING or t.epoch > last_epoch or self._closed(t)
        )
        for task_id, assignment in list(self.doing.items()):
            if assignment.task.kind == TRAINING:
                del self.doing[task_id]
                self._closed(assignment.task)
        queued = 0
        for epoch in range(last_epoch + 1):
            for source in range(len(self.train)):
                expected = self._whole(source)
                done = self.done.setdefault((epoch, source), set())
                keep = expected & have.get((epoch, source), set())
                self.done_count += len(keep) - len(done)
                self.done[(epoch, source)] = set(keep)
                self._share_if_whole(epoch, source)
                missing = sorted(expected - keep)
                if missing:
                    self.requeue_batches(epoch, source, missing, "every replica lost")
                queued += len(missing)
        return queued

    def hold_only(
        self, held: dict[tuple[int, int], set[int]], last_epoch: int, reason: str
    ) -> list[tuple[int, int, list[int]]]:
        """Make the record of done minibatches (epochs up to `last_epoch`) what `held`
        says is really applied, queueing again what is not: for an epoch whose tasks have
        all ended, every minibatch must be held (`settle`); for an open one, every
        minibatch counted done. Returns (epoch, source, minibatches queued again)."""
        queued = []
        for epoch in range(last_epoch + 1):
            closed = not self.training_pending(epoch)
            for source, src in enumerate(self.train):
                have = held.get((epoch, source), set())
                done = self.done.get((epoch, source), set())
                if closed and len(done) == len(have) == -(-src.num_records // self.batch):
                    continue  # settled, and held whole: nothing to change (nor to journal)
                if closed:
                    missing = self.settle(epoch, source, have)
                else:
                    missing = sorted(done - have) if not self.training_stopped else []
                    if missing:
                        self.requeue_batches(epoch, source, missing, reason)
                if missing:
                    queued.append((epoch, source, missing))
        return queued

    @recorded
    def settle(self, epoch: int, source: int, held: set[int]) -> list[int]:
        """Make `done` what every PS holds, for an epoch none of whose tasks is open:
        minibatches held but never reported count as done, and the ones not held (lost
        in a rollback, or never applied) are queued again. Returns those."""
        held = set(held)  # (a replayed call gives a list)
        expected = self._whole(source)
        done = self._mutable_done(epoch, source)
        settled = expected & held
        self.done_count += len(settled - done)
        done.update(settled)
        self._share_if_whole(epoch, source)
        missing = [] if self.training_stopped else sorted(expected - held)
        if missing:
            self.requeue_batches(epoch, source, missing, "not on every PS")
        return missing

    def _whole(self, source: int) -> frozenset[int]:
        """Every minibatch start of training source `source`."""
        whole = self._wholes.get(source)
        if whole is None:
            starts = batch_starts(0, self.train[source].num_records, self.batch)
            whole = self._wholes[source] = frozenset(starts)
        return whole

    def _mutable_done(self, epoch: int, source: int) -> set[int]:
        """The done set of (epoch, source), to be changed (a shared whole one is copied)."""
        done = self.done.setdefault((epoch, source), set())
        if isinstance(done, frozenset):
            done = self.done[(epoch, source)] = set(done)
        return done

    def _share_if_whole(self, epoch: int, source: int) -> None:
        if len(self.done[(epoch, source)]) == len(self._whole(source)):
            self.done[(epoch, source)] = self._whole(source)

    def pending(self, kind: int) -> bool:
        return any(k == kind for k, _ in self._open)

    def records_done(self, epoch: int) -> int:
        total = 0
        for i, src in enumerate(self.train):
            done = self.done.get((epoch, i), ())
            total += len(done) * self.batch
            last = (src.num_records - 1) // self.batch * self.batch  # (it may be short)
            if src.num_records and last in done:
                total -= self.batch - (src.num_records - last)
        return total

    def _opened(self, tasks: list[Task]) -> list[Task]:
        """`tasks`, counted open (queued, then handed out until they finish)."""
        for task in tasks:
            self._open[(task.kind, task.epoch)] += 1
        return tasks

    def _closed(self, task: Task) -> bool:
        """Count `task` closed (finished, dropped or taken back); False, for filters."""
        key = (task.kind, task.epoch)
        self._open[key] -= 1
        if self._open[key] <= 0:
            del self._open[key]
        return False


def _runs(starts: list[int], step: int) -> list[tuple[int, int]]:
    """Contiguous runs of minibatch starts as [first, last + step) ranges."""
    runs: list[tuple[int, int]] = []
    for s in starts:
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], s + step)
        else:
            runs.append((s, s + step))
    return runs
