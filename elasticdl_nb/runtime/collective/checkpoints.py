"""The allreduce replicas' checkpoints: what a job resumes from when every replica is lost
at once (the replicas are the only copy of the model).

Every `checkpoint_steps` steps the group's first member copies its replica's state
(weights and optimizer slots: a memory copy, on the step's path) and notes how many
minibatches it has applied (`Applied`, in the order applied), and a thread of its own
writes them to the job directory, so the step goes on at once:
`checkpoints/replicas-<step>.npz`, the minibatches applied since its last checkpoint
appended to its own `replicas-applied-<worker>.log` (so a write costs what is new, not
the whole history), then `replicas-<step>.json`, which names that file and how many of
its lines the state holds, and whose presence makes the checkpoint whole. A write still
under way when the next one is due makes that one skipped, never waited for; and the
writer keeps to a share of the time (`MAX_BUSY_SHARE`): on a machine with no core to
spare, a writer that writes back to back takes CPU and the GIL from the step itself (the
digits MLP checkpointed every 10 steps wrote 50 times a second and trained 15 % slower).

The master reads the newest whole one (`newest`) when the last member of the group is
lost: the queue is made what the checkpoint holds (the rest is trained again) and the
group that forms next starts from it (`GroupInfo.restore`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("elasticdl_nb.worker")

PREFIX = "replicas-"


class Applied:
    """Which minibatches (epoch, source, start) a replica's state holds, in the order it
    applied them. Only ever appended to, so a checkpoint takes its length on the step's
    path (`mark`) and its writer turns that many into runs later, on its own thread."""

    def __init__(self, minibatch_size: int):
        self.batch = minibatch_size
        self._log: list[tuple[int, int, int]] = []

    def add(self, minibatches: Iterable[tuple[int, int, int]]) -> None:
        self._log.extend(minibatches)

    def mark(self) -> int:
        return len(self._log)

    def since(self, start: int, end: int) -> list[tuple[int, int, int]]:
        return self._log[start:end]

    def held(self, upto: int | None = None) -> dict[tuple[int, int], set[int]]:
        out: dict[tuple[int, int], set[int]] = defaultdict(set)
        for epoch, source, start in self._log[:upto]:
            out[(epoch, source)].add(start)
        return dict(out)

    def to_json(self, upto: int | None = None) -> dict:
        """{"epoch:source": [[first start, count], ...]}: runs of consecutive minibatches,
        of the first `upto` applied (all by default)."""
        out = {}
        for (epoch, source), starts in sorted(self.held(upto).items()):
            runs: list[list[int]] = []
            for s in sorted(starts):
                if runs and runs[-1][0] + runs[-1][1] * self.batch == s:
                    runs[-1][1] += 1
                else:
                    runs.append([s, 1])
            out[f"{epoch}:{source}"] = runs
        return out

    @classmethod
    def from_json(cls, minibatch_size: int, data: dict) -> Applied:
        applied = cls(minibatch_size)
        for key, runs in data.items():
            epoch, source = map(int, key.split(":"))
            applied.add(
                (epoch, source, first + i * minibatch_size)
                for first, count in runs
                for i in range(count)
            )
        return applied

    def to_bytes(self) -> np.ndarray:
        """As one array, to travel with a replica's state to a member that joins."""
        return np.frombuffer(json.dumps(self.to_json()).encode(), np.uint8)

    @classmethod
    def from_bytes(cls, minibatch_size: int, array: np.ndarray) -> Applied:
        return cls.from_json(minibatch_size, json.loads(array.tobytes().decode() or "{}"))


@dataclass(frozen=True)
class Checkpoint:
    step: int
    version: int
    path: Path  # the .json; its arrays are beside it (.npz)
    applied: Applied

    def arrays(self) -> list[np.ndarray]:
        with np.load(self.path.with_suffix(".npz")) as data:
            return [data[f"arr_{i}"] for i in range(len(data.files))]


MAX_BUSY_SHARE = 0.02  # of wall time, that a member's checkpoint writer may spend writing


class CheckpointWriter:
    """One member's writer: `maybe_save` on the step's path, the writing on a thread."""

    def __init__(
        self,
        directory: Path,
        every: int,
        keep: int,
        member: int,
        max_busy_share: float = MAX_BUSY_SHARE,
    ):
        self.directory, self.every, self.keep = directory, every, keep
        self._applied_log = directory / f"{PREFIX}applied-{member}.log"
        self._logged = 0  # lines of the applied log written
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="replica-checkpoint")
        self._writing: Future | None = None
        self._idle = 1.0 / max_busy_share - 1.0  # seconds idle per second written
        self._not_before = 0.0  # (time.monotonic) when the writer may start again
        self.copy_seconds: list[float] = []  # what the step paid, per checkpoint

    def maybe_save(
        self, step: int, version: int, state: Callable[[], list[np.ndarray]], applied: Applied
    ) -> bool:
        """At every `every`-th step: copy the state now (`state()`), write it later.
        Returns whether a checkpoint was started."""
        if step % self.every or (self._writing is not None and not self._writing.done()):
            return False
        if time.monotonic() < self._not_before:
            return False  # it wrote a moment ago: its share of the time is spent
        started = time.perf_counter()
        arrays, upto = state(), applied.mark()
        self.copy_seconds.append(time.perf_counter() - started)
        self._writing = self._thread.submit(self._write, step, version, arrays, applied, upto)
        return True

    def _write(
        self, step: int, version: int, arrays: list[np.ndarray], applied: Applied, upto: int
    ) -> None:
        began = time.monotonic()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self._applied_log, "a") as out:
                out.write(
                    "".join(f"{e} {s} {b}\n" for e, s, b in applied.since(self._logged, upto))
                )
            self._logged = upto
            record = {
                "step": step,
                "version": version,
                "applied_log": self._applied_log.name,
                "applied": upto,
            }
            base = self.directory / f"{PREFIX}{step:012d}"
            tmp = base.with_name(f".{base.name}.tmp.npz")
            np.savez(tmp, *arrays)
            os.replace(tmp, base.with_suffix(".npz"))
            tmp = base.with_name(f".{base.name}.tmp.json")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, base.with_suffix(".json"))  # last: now it is whole
            for old in _whole(self.directory)[: -self.keep]:
                old.unlink(missing_ok=True)
                old.with_suffix(".npz").unlink(missing_ok=True)
        except Exception:  # a checkpoint that cannot be written must not stop training
            log.exception("replica checkpoint at step %d not written", step)
        finally:
            ended = time.monotonic()
            self._not_before = ended + (ended - began) * self._idle

    def close(self) -> None:
        self._thread.shutdown(wait=True)


def _whole(directory: Path) -> list[Path]:
    """The whole checkpoints' .json files, oldest first."""
    return sorted(p for p in directory.glob(f"{PREFIX}*.json") if p.with_suffix(".npz").exists())


def read(path: Path, minibatch_size: int) -> Checkpoint:
    """The checkpoint whose record is `path` (a .json)."""
    record = json.loads(path.read_text())
    applied = Applied(minibatch_size)
    with open(path.parent / record["applied_log"]) as lines:
        applied.add(tuple(map(int, next(lines).split())) for _ in range(record["applied"]))
    return Checkpoint(record["step"], record["version"], path, applied)


def newest(directory: Path, minibatch_size: int) -> Checkpoint | None:
    """The newest whole checkpoint in `directory`, or None."""
    for path in reversed(_whole(directory)):
        try:
            return read(path, minibatch_size)
        except (OSError, ValueError):
            continue
    return None


ROLLBACKS = "rollbacks.jsonl"


def record_rollback(replicas: Path, step: int, workers: list[int]) -> None:
    """Every replica of `workers` was lost, and the job goes on from the checkpoint of
    `step`: what they applied after it is undone (the ledgers' check reads this)."""
    replicas.mkdir(parents=True, exist_ok=True)
    with open(replicas / ROLLBACKS, "a") as out:
        out.write(json.dumps({"step": step, "workers": sorted(workers)}) + "\n")


def rollbacks(replicas: Path) -> list[dict]:
    path = replicas / ROLLBACKS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
