"""Goodput under chaos (issue 16): a long job under a seeded kill schedule against the same
job without faults, in one run.

    .venv/bin/python bench/chaos.py [--quick] [--seed N] [--minutes M]

The job: the digits MLP of bench/workloads.py (Adam, 1,408 records, minibatches of 64,
two per task), every process pinned to one thread (bench/harness.py), with enough epochs
that the fault-free job runs at least `--minutes` (5; a short calibration job measures
the rate first), and as many training processes as cores (2 here: 1 worker + 1 PS, or 2
allreduce workers), so that the time a lost worker is gone is really lost: with more
workers than cores, the others took up a killed one's core and the chaos job lost
little wall time however slow its recovery (issue 37). Per strategy, one after the other
on the same machine:

- fault-free: the job as it is;
- chaos: the same job while a seeded schedule SIGKILLs, from its first applied minibatch
  until its training phase ends, a random live worker every 20 s, the PS every 90 s
  (parameter-server strategy) and the master every 120 s (each stream starting at a
  random phase of its period). Local backend: the supervisor restarts the master, the
  master relaunches workers and the PS.

Reported per strategy: goodput = fault-free wall time / chaos wall time, which for the
same work is the useful steps of the chaos job over the fault-free job's in the same time
(target >= 0.90; wall time is the journal's first event to its final `job_state`); beside
it the job's own goodput (`Job.status()`'s, the master's accounting), records applied twice
and never (both must be 0: the PS ledger, or the replicas' ledgers), and the final test
accuracy (on the 389 digits the job never saw) against the fault-free job's. `--quick`:
2-minute jobs, for a look (the target is for 5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import harness
from harness import log, row, write_result

harness.pin_threads()
import numpy as np  # noqa: E402
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)

import elasticdl_nb as edl  # noqa: E402
from elasticdl_nb.runtime.ps.ledger import record_counts  # noqa: E402
from elasticdl_nb.runtime.worker.replica_records import applications  # noqa: E402
from elasticdl_nb.vocabulary import INSTANCE_ENDED  # noqa: E402

WORKERS = {"ps": 1, "allreduce": 2}  # with the PS: a training process per core (of 2)
PER_TASK = 2
PERIODS = {"worker": 20.0, "ps": 90.0, "master": 120.0}
CALIBRATION_EPOCHS = 30
FAULT_SEED_ENV = "ELASTICDL_NB_FAULT_SEED"


def _test_split() -> tuple[np.ndarray, np.ndarray]:
    x, y = workloads.digits_data(1797)  # the same order: the job trains on the first 1,408
    return x[1408:], y[1408:]


def _train(w: workloads.Workload, strategy: str, epochs: int, tag: str) -> edl.Job:
    return w.train(
        workers=WORKERS[strategy],
        strategy=strategy,
        epochs=epochs,
        checkpoint_steps=50,
        record_ledger=True,
        # The schedule kills far more than a crash budget is for (one every 20 s): the
        # benchmark measures recovery, not the budget.
        max_worker_relaunches=10_000,
        max_ps_relaunches=10_000,
        name=f"chaos-{strategy}-{tag}",
    )


def _wall(job: edl.Job) -> float:
    events = list(job.events(follow=False))
    ends = [e.time for e in events if e.kind == "job_state" and e.data["state"] != "running"]
    return ends[-1] - events[0].time


def _epochs_per_second(job: edl.Job) -> float:
    """The training rate, between the first and the last `epoch` event (no start-up)."""
    starts = [e.time for e in job.events(follow=False) if e.kind == "epoch"]
    return (len(starts) - 1) / (starts[-1] - starts[0])


def _status(job: edl.Job) -> dict:
    try:
        return job.status()
    except Exception:  # noqa: BLE001 - the master is being replaced: ask again later
        return {}


class Chaos:
    """The kill schedule, on a thread of its own while the job trains."""

    def __init__(self, job: edl.Job, strategy: str, rng: random.Random):
        self.job, self.rng = job, rng
        self.roles = ["worker", "master"] + (["ps"] if strategy == "ps" else [])
        self.kills: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set() and not _status(self.job).get("step"):
            time.sleep(0.2)
        t0 = time.monotonic()
        due = {r: t0 + self.rng.uniform(0, PERIODS[r]) for r in self.roles}
        while not self._stop.wait(0.2):
            status = _status(self.job)
            if status.get("state") not in (None, "running"):
                return
            if status and status.get("phase") != "training":
                return  # the schedule covers training; the end of the job is not retried
            for role in self.roles:
                if time.monotonic() >= due[role] and status and self._kill(role, status):
                    due[role] += PERIODS[role]

    def _kill(self, role: str, status: dict) -> bool:
        if role == "master":
            pid, victim = json.loads((Path(self.job.dir) / "master.json").read_text())["pid"], 0
        else:
            live = [
                (i["id"], i["pid"])
                for i in status["instances"]
                if i["role"] == role and i["pid"] and i["state"] not in INSTANCE_ENDED
            ]
            if not live:
                return False  # none up right now (being relaunched): try again shortly
            victim, pid = self.rng.choice(sorted(live))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.kills.append(
            {"role": role, "id": victim, "step": status.get("step"), "time": time.time()}
        )
        log(f"  chaos: SIGKILL {role} {victim} (pid {pid}) at step {status.get('step')}")
        return True


def _exactly_once(
    job: edl.Job, strategy: str, w: workloads.Workload, epochs: int
) -> tuple[int, int]:
    """(records applied twice or more, records never applied), over every epoch."""
    twice = never = 0
    if strategy == "ps":
        counts = record_counts(job.dir, 0, [w.records])
        for epoch in range(epochs):
            tally = counts.get((epoch, 0), np.zeros(w.records, np.int64))
            twice += int((tally > 1).sum())
            never += int((tally == 0).sum())
        return twice, never
    times = applications(job.dir)
    for epoch in range(epochs):
        for start in range(0, w.records, w.batch):
            n = times.get((epoch, 0, start), 0)
            size = min(w.batch, w.records - start)
            twice += size if n > 1 else 0
            never += size if n == 0 else 0
    return twice, never


def _run(w, strategy: str, epochs: int, tag: str, rng: random.Random | None) -> dict[str, Any]:
    job = _train(w, strategy, epochs, tag)
    chaos = Chaos(job, strategy, rng) if rng else None
    if chaos:
        chaos.start()
    try:
        final = job.wait(timeout=epochs * 60, progress=False)
    finally:
        if chaos:
            chaos.stop()
        if _status(job).get("state") in ("running", "starting"):
            job.stop()
    xt, yt = _test_split()
    accuracy = float((job.model().predict(xt, verbose=0).argmax(1) == yt).mean())
    twice, never = _exactly_once(job, strategy, w, epochs)
    events = list(job.events(follow=False))
    out = {
        "state": final["state"],
        "wall": _wall(job),
        "accuracy": accuracy,
        "twice": twice,
        "never": never,
        "kills": chaos.kills if chaos else [],
        "master_restarts": [e.data for e in events if e.kind == "master_restarted"],
        "relaunches": sum(e.kind == "relaunch" for e in events),
        "goodput_reported": final.get("goodput"),
        "epochs_per_second": _epochs_per_second(job),
    }
    log(
        f"  {tag}: {final['state']} in {out['wall']:.1f} s, accuracy {accuracy:.4f}, "
        f"{twice} records applied twice, {never} never, {len(out['kills'])} kills"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2-minute jobs")
    parser.add_argument("--seed", type=int, default=None, help=f"or ${FAULT_SEED_ENV}")
    parser.add_argument("--minutes", type=float, default=None, help="fault-free job length")
    parser.add_argument("--strategies", default="ps,allreduce")
    args = parser.parse_args()
    minutes = args.minutes or (2.0 if args.quick else 5.0)
    seed = args.seed if args.seed is not None else os.environ.get(FAULT_SEED_ENV)
    seed = int(seed) if seed is not None else random.SystemRandom().randrange(2**31)
    log(f"fault seed {seed} (replay with --seed {seed} or {FAULT_SEED_ENV}={seed})")
    rng = random.Random(seed)
    w = dataclasses.replace(workloads.workloads()["digits"], per_task=PER_TASK)
    started = time.perf_counter()
    rows, details = [], {"seed": seed, "minutes": minutes, "runs": {}}
    with harness.job_home():
        for strategy in args.strategies.split(","):
            calibration = _run(w, strategy, CALIBRATION_EPOCHS, "calibration", None)
            epochs = math.ceil(60 * minutes * 1.1 * calibration["epochs_per_second"])
            log(f"{strategy}: {epochs} epochs for a fault-free job of about {minutes:g} min")
            base = _run(w, strategy, epochs, "fault-free", None)
            ours = _run(w, strategy, epochs, "chaos", rng)
            details["runs"][strategy] = {"epochs": epochs, "fault_free": base, "chaos": ours}
            kills = ", ".join(
                f"{sum(k['role'] == r for k in ours['kills'])} {r}"
                for r in ("worker", "ps", "master")
            )
            case = f"{strategy}, {WORKERS[strategy]} worker(s), kills: {kills}"
            rows += [
                row(case, "job wall time (goodput)", [ours["wall"]], [base["wall"]], unit="s",
                    baseline_label="fault-free", higher_is_better=False, target=0.90,
                    note="ratio = fault-free wall / chaos wall = goodput"),
                row(case, "the job's own goodput (the master's accounting)",
                    [ours["goodput_reported"] or 0.0], [base["goodput_reported"] or 0.0],
                    baseline_label="fault-free job's own", target=0.90),
                row(case, "records applied twice", [ours["twice"]], higher_is_better=False,
                    limit=0),
                row(case, "records never applied", [ours["never"]], higher_is_better=False,
                    limit=0),
                row(case, "test accuracy", [ours["accuracy"]], [base["accuracy"]],
                    baseline_label="fault-free", target=0.98),
            ]  # fmt: skip
    write_result(
        "chaos",
        "Goodput under a chaos schedule: a worker every 20 s, the PS every 90 s, the master "
        "every 120 s, against the same job without faults",
        rows,
        details,
        command=".venv/bin/python bench/chaos.py",
        seconds=time.perf_counter() - started,
    )


if __name__ == "__main__":
    main()
