"""Allreduce recovery (issue 7): our in-place recovery against restart-style recovery.

    .venv/bin/python bench/allreduce_recovery.py [--quick] [--seed N]

The same job on both sides: the digits MLP of bench/workloads.py (Adam), 1,408 records,
minibatches of 64, 3 workers averaging gradients every step with the ring allreduce; every
process pinned to one thread (bench/harness.py). Per repeat, alternating:

- ours: `edl.train(..., strategy="allreduce", workers=3)`. Once the group has stepped for
  STEADY seconds (plus a random fraction of a second), a random worker is SIGKILLed. The
  survivors notice, agree on the smaller group with the master, and carry on in place.
  From the journal's `group_settled` event (cause "failure"), stamped by the survivor that
  reports it: kill -> next completed step (completed_at - t_kill), of which detection is
  kill -> the survivor's PeerLost, and in-place recovery the rest (`seconds`).
- restart-style, as TorchElastic or Horovod Elastic handle it: bench/restart_worker.py,
  three processes training the same replica over the same ring, rank 0 checkpointing
  every 50 steps. The agent (this script) polls its children every 0.1 s (torchrun's
  monitor interval); when one is gone it stops the others (SIGTERM, then SIGKILL after
  5 s, as torchrun) and starts all three again; they load the checkpoint, rendezvous and
  go on. Kill -> the new incarnation's first completed step (its stamp file); detection is
  kill -> the agent's poll that saw it; steps rolled back = the last step completed before
  the kill minus the checkpoint's.

Targets (issue 7): ours at least 10x faster than restart-style, and ours under 1 s plus
failure detection. Kill points are drawn from a seeded RNG (--seed or
ELASTICDL_NB_FAULT_SEED; printed).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import harness

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)

import elasticdl_nb as edl  # noqa: E402
from elasticdl_nb.backends.local.processes import terminate  # noqa: E402

WORKERS, BATCH, PER_TASK = 3, 64, 11
STEADY = 3.0  # seconds the group trains before the kill
POLL = 0.1  # the restart agent's monitor interval
FAULT_SEED_ENV = "ELASTICDL_NB_FAULT_SEED"
HERE = Path(__file__).resolve().parent


def _events(job, kind: str) -> list[dict]:
    return [e.data for e in job.events(follow=False) if e.kind == kind]


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def in_place(rng: random.Random, tag: str) -> dict:
    """Our allreduce job; one worker SIGKILLed once the group is steady."""
    job = edl.train(
        workloads.digits_mlp,
        loss=workloads.digits_loss,
        optimizer=workloads.adam,
        data=workloads.digits_data(1408),
        workers=WORKERS,
        strategy="allreduce",
        epochs=100_000,  # stopped once recovered
        minibatch_size=BATCH,
        minibatches_per_task=PER_TASK,
        name=f"allreduce-recovery-{tag}",
    )
    try:
        formed = _wait(lambda: _events(job, "group_settled"), 180, "the group's first step")
        time.sleep(max(0.0, formed[0]["completed_at"] + STEADY - time.time()))
        time.sleep(rng.random())
        status = job.status()
        victim = rng.randrange(WORKERS)
        pid = next(i["pid"] for i in status["instances"] if i["id"] == victim)
        steps_before = status["step"]
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)

        def recovered():
            return [s for s in _events(job, "group_settled") if s["cause"] == "failure"]

        settled = _wait(recovered, 60, "the survivors' next step")[0]
        failure = next(g for g in _events(job, "group") if g["reason"] == "failure")
        timings = [t for t in _events(job, "worker_time") if t["minibatches"]]
        step_s = sorted(t["task_s"] / t["minibatches"] for t in timings)
        out = {
            "job": job.name,
            "victim": victim,
            "minibatches_before_kill": steps_before,
            "kill_to_next_step_s": settled["completed_at"] - t_kill,
            "detection_s": settled["completed_at"] - settled["seconds"] - t_kill,
            "recovery_s": settled["seconds"],
            "master_agreed_s": failure["agreed_s"],
            "step_time_s": step_s[len(step_s) // 2] if step_s else None,
            "steps_rolled_back": 0,  # replicas keep every applied step; see the module doc
        }
    finally:
        job.stop()
    return out


def _stamps(directory: Path, incarnation: int) -> list[tuple[int, float]]:
    out = []
    for path in directory.glob(f"stamps-{incarnation}-*.txt"):
        for line in path.read_text().splitlines():
            step, when = line.split()
            out.append((int(step), float(when)))
    return out


def _first_steps(directory: Path, incarnation: int, procs: list[subprocess.Popen]):
    """The stamps of `incarnation` once it has completed a step. RuntimeError, with the
    incarnation's log, as soon as one of its workers exits without one, or after 180 s."""

    def stamped():
        if stamps := _stamps(directory, incarnation):
            return stamps
        if exited := [(r, p.returncode) for r, p in enumerate(procs) if p.poll() is not None]:
            gone = ", ".join(f"rank {r} (exit status {code})" for r, code in exited)
            raise RuntimeError(f"{gone} exited before a step; {_log_tail(directory, incarnation)}")
        return None

    try:
        return _wait(stamped, 180, f"incarnation {incarnation}'s first step")
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}: {_log_tail(directory, incarnation)}") from None


def _log_tail(directory: Path, incarnation: int, lines: int = 40) -> str:
    log = directory / f"incarnation-{incarnation}.log"
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return "its workers' log ends:\n" + "\n".join(text.splitlines()[-lines:])


def restart_style(rng: random.Random, home: Path, tag: str) -> dict:
    directory = home / f"restart-{tag}"
    directory.mkdir()
    ports = harness.free_ports(WORKERS)

    def start(incarnation: int) -> list[subprocess.Popen]:
        log = open(directory / f"incarnation-{incarnation}.log", "a")  # noqa: SIM115
        return [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "restart_worker.py"),
                    "--rank",
                    str(r),
                    "--ports",
                    ",".join(map(str, ports)),
                    "--dir",
                    str(directory),
                    "--incarnation",
                    str(incarnation),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=harness.pinned_env(),
                cwd=harness.ROOT,
            )  # fmt: skip
            for r in range(WORKERS)
        ]

    procs = start(1)
    try:
        first = _first_steps(directory, 1, procs)
        time.sleep(max(0.0, min(t for _, t in first) + STEADY - time.time()))
        time.sleep(rng.random())
        victim = rng.randrange(WORKERS)
        t_kill = time.time()
        procs[victim].kill()
        while all(p.poll() is None for p in procs):  # the agent's monitor loop
            time.sleep(POLL)
        t_detect = time.time()
        terminate(procs, grace_seconds=5)
        before = max(s for s, _ in _stamps(directory, 1))
        checkpoint = 0
        if (directory / "checkpoint.npz").exists():
            import numpy as np

            checkpoint = int(np.load(directory / "checkpoint.npz")["step"])
        procs = start(2)
        again = _first_steps(directory, 2, procs)
        first_step, t_first = min(again, key=lambda s: s[1])
        steps = sorted(t for _, t in _stamps(directory, 1))
        intervals = sorted(b - a for a, b in zip(steps, steps[1:]) if b - a > 0)
        return {
            "victim": victim,
            "kill_to_next_step_s": t_first - t_kill,
            "detection_s": t_detect - t_kill,
            "steps_rolled_back": before - checkpoint,
            "last_step_before_kill": before,
            "checkpoint_step": checkpoint,
            "first_step_after": first_step,
            "step_time_s": intervals[len(intervals) // 2] * WORKERS if intervals else None,
        }
    finally:
        terminate(procs, grace_seconds=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat instead of two")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed
    if seed is None:
        seed = int(os.environ.get(FAULT_SEED_ENV) or random.SystemRandom().randrange(2**31))
    harness.log(f"allreduce_recovery: fault seed {seed} (replay with --seed {seed})")
    rng = random.Random(seed)
    t0 = time.perf_counter()
    ours, theirs = [], []
    with harness.job_home() as home:
        for rep in range(1 if args.quick else 2):
            ours.append(in_place(rng, f"r{rep}"))
            harness.log(f"in place, run {rep + 1}: {ours[-1]}")
            theirs.append(restart_style(rng, home, f"r{rep}"))
            harness.log(f"restart-style, run {rep + 1}: {theirs[-1]}")

    def col(runs, key):
        return [r[key] for r in runs if r.get(key) is not None]

    case = "digits MLP, 3 workers, allreduce: SIGKILL of one worker"
    rows = [
        harness.row(
            case, "kill -> next completed step", col(ours, "kill_to_next_step_s"),
            col(theirs, "kill_to_next_step_s"), unit="s", higher_is_better=False, target=10,
            baseline_label="restart-style (all workers restarted from the last checkpoint)",
        ),
        harness.row(
            case, "in-place recovery after detection (noticed -> next step)",
            col(ours, "recovery_s"), unit="s", higher_is_better=False, limit=1.0,
        ),
        harness.row(
            case, "failure detection (kill -> noticed)", col(ours, "detection_s"),
            col(theirs, "detection_s"), unit="s", higher_is_better=False,
            baseline_label="restart agent polling every 0.1 s",
        ),
        harness.row(
            case, "steps rolled back", col(ours, "steps_rolled_back"),
            col(theirs, "steps_rolled_back"), unit="steps", higher_is_better=False,
            baseline_label="restart-style, checkpoint every 50 steps",
        ),
    ]  # fmt: skip
    harness.write_result(
        "allreduce_recovery",
        "Allreduce: in-place recovery vs restart-style recovery",
        rows,
        {"seed": seed, "ours": ours, "restart_style": theirs},
        command=" ".join([".venv/bin/python bench/allreduce_recovery.py", *sys.argv[1:]]),
        seconds=time.perf_counter() - t0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
