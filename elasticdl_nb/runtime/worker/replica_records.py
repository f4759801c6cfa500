"""What each allreduce replica writes down, and the check that they all agree.

Every member appends to two files in the job's `replicas/` directory:
- `worker-N.ledger` (with the `record_ledger` option): a line "step epoch source start"
  per minibatch of every step it applied (every member's: the ids ride the allreduce);
- `worker-N.jsonl`: its state's checksum (SHA-256 of weights and optimizer slots) when
  it enters the group, after every switch or recovery, and at its end.

`replica_problems` reads them back: replicas with a checksum at the same step of the
same group version must be identical, ledgers must agree step by step, and over the
whole job every minibatch of every epoch must be applied exactly once. (When every
replica was lost and the job went back to the replicas' checkpoint, the steps the lost
workers applied after it are undone: `checkpoints.record_rollback`.)
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

from elasticdl_nb.runtime.collective.checkpoints import rollbacks
from elasticdl_nb.runtime.job_dir import JobDir

Minibatch = tuple[int, int, int]  # (epoch, source, start)


class ReplicaRecords:
    """One member's writer."""

    def __init__(self, job_dir: Path, worker: int, ledger: bool):
        directory = JobDir(job_dir).replicas
        directory.mkdir(exist_ok=True)
        self.worker = worker
        self._ledger = None  # (a line per minibatch: kept only with record_ledger)
        if ledger:
            path = directory / f"worker-{worker}.ledger"
            self._ledger = open(path, "a", buffering=1)  # noqa: SIM115
        self._checksums = directory / f"worker-{worker}.jsonl"

    def applied(self, step: int, minibatches: list[Minibatch]) -> None:
        if self._ledger is not None:
            self._ledger.write("".join(f"{step} {e} {s} {b}\n" for e, s, b in minibatches))

    def checksum(
        self, event: str, version: int, step: int, checksum: str, learning_rate: float | None
    ) -> None:
        line = {
            "event": event, "worker": self.worker, "pid": os.getpid(), "version": version,
            "step": step, "checksum": checksum, "learning_rate": learning_rate,
            "time": time.time(),
        }  # fmt: skip
        with open(self._checksums, "a") as out:
            out.write(json.dumps(line) + "\n")


def read_checksums(job_dir: Path) -> list[dict]:
    lines = []
    for path in sorted((JobDir(job_dir).replicas).glob("worker-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line]
    return lines


def read_ledgers(job_dir: Path) -> dict[int, dict[int, list[Minibatch]]]:
    """worker -> step -> the minibatches that step applied."""
    ledgers: dict[int, dict[int, list[Minibatch]]] = {}
    for path in sorted((JobDir(job_dir).replicas).glob("worker-*.ledger")):
        steps: dict[int, list[Minibatch]] = defaultdict(list)
        for line in path.read_text().splitlines():
            step, epoch, source, start = map(int, line.split())
            steps[step].append((epoch, source, start))
        ledgers[int(path.stem.split("-")[1])] = steps
    return ledgers


def _history(job_dir: Path) -> tuple[dict[int, list[Minibatch]], list[str]]:
    """step -> the minibatches it applied, from every ledger (steps a rollback undid are
    left out), and where two ledgers disagree about a step."""
    problems = []
    history: dict[int, list[Minibatch]] = {}
    undone = {  # worker -> the checkpoint step the job went back to when it was lost
        w: r["step"] for r in rollbacks(JobDir(job_dir).replicas) for w in r["workers"]
    }
    for worker, steps in read_ledgers(job_dir).items():
        for step, minibatches in steps.items():
            if step > undone.get(worker, step):
                continue  # lost with every replica: the job went back before it
            seen = history.setdefault(step, sorted(minibatches))
            if seen != sorted(minibatches):
                problems.append(f"worker {worker}'s ledger differs from another's at step {step}")
    return history, problems


def _steps_of(history: dict[int, list[Minibatch]]) -> dict[Minibatch, list[int]]:
    applied: dict[Minibatch, list[int]] = defaultdict(list)
    for step, minibatches in history.items():
        for minibatch in minibatches:
            applied[minibatch].append(step)
    return applied


def applications(job_dir: Path) -> dict[Minibatch, int]:
    """How many times each minibatch was applied over the whole job (by the ledgers)."""
    history, _ = _history(job_dir)
    return {m: len(steps) for m, steps in _steps_of(history).items()}


def replica_problems(
    job_dir: Path, records_per_source: list[int], minibatch_size: int, epochs: int
) -> list[str]:
    """Every way the replicas break 'identical, and each minibatch applied exactly once
    per epoch'; empty if none."""
    problems = []
    # (By group version too: a member that leaves at a step keeps the learning rate of
    # its old group, which lr_scaling changes for the others at that step.)
    by_step: dict[tuple[int, int], set[str]] = defaultdict(set)
    for line in read_checksums(job_dir):
        by_step[(line["version"], line["step"])].add(line["checksum"])
    for (version, step), sums in sorted(by_step.items()):
        if len(sums) > 1:
            problems.append(f"replicas of group {version} differ at step {step}: {len(sums)}")

    history, disagree = _history(job_dir)
    problems += disagree
    applied = _steps_of(history)
    for epoch in range(epochs):
        for source, n in enumerate(records_per_source):
            for start in range(0, n, minibatch_size):
                steps = applied.pop((epoch, source, start), [])
                if len(steps) != 1:
                    problems.append(
                        f"epoch {epoch} source {source} minibatch at {start}: applied "
                        f"{len(steps)} times (steps {steps})"
                    )
    if applied:
        problems.append(f"minibatches that are no part of the data: {sorted(applied)[:5]}")
    return problems
