"""Re-record the journals in this folder: real digits jobs on the local backend, each with
one fault or action, their `events.jsonl`, final `state.json` and `spec.json` copied into
`tests/journals/<name>/`; then a summary of every journal here (event counts by kind, the
keys each kind's data held), also written as `keys.json`.

    .venv/bin/python tests/journals/record.py [name[:seed] ...]

With no names, every journal is recorded, one job after another. A journal with a
random fault prints its seed; `name:seed` replays that choice. The jobs run under a
temporary ELASTICDL_NB_HOME, and none outlives this script.

Pacing: every minibatch's loss sleeps for the seconds written in the file `pace` of the
job directory (0.05 s when there is none). The script holds a job slow (`HOLD`) while it
steers it, and lets it run fast (`FAST`) once everything it waits for has happened, so
each journal holds what it should on a loaded machine and the job still ends soon after.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HOLD = 0.4  # seconds per minibatch while the script steers a job
FAST = 0.02  # once it has done what it came for
COPIED = ("events.jsonl", "state.json", "spec.json")


def paced_loss(labels, predictions):
    """The digits loss; each minibatch first sleeps for the seconds in the job
    directory's `pace` file (0.05 without one), in steps of 10 ms."""
    import os
    import time

    import tensorflow as tf

    def pause():
        try:
            path = os.path.join(os.environ["ELASTICDL_NB_JOB_DIR"], "pace")
            with open(path) as f:
                seconds = float(f.read())
        except (KeyError, OSError, ValueError):
            seconds = 0.05
        # In steps of 10 ms: a worker stopped from outside (SIGSTOP, the straggler
        # recording) takes that much longer, as it would for a computation.
        for _ in range(round(seconds / 0.01)):
            time.sleep(0.01)
        return 0.0

    paused = tf.py_function(pause, [], tf.float32)
    loss = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )
    return loss + 0.0 * tf.reshape(paused, [])


# ---------------------------------------------------------------------- helpers


def set_pace(job, seconds: float) -> None:
    path = Path(job.dir) / "pace"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(seconds))
    tmp.replace(path)


def start(**options):
    """A digits job (tests/integration/models.py), paced, held slow from the start."""
    from tests.integration.models import digits_job

    job, _, _ = digits_job(loss=paced_loss, **options)
    set_pace(job, HOLD)
    print(f"  job {job.name} in {job.dir}", flush=True)
    return job


def events(job, kind: str | None = None) -> list:
    return [e for e in job.events(follow=False) if kind is None or e.kind == kind]


def seeded(name: str, seeds: dict[str, int]) -> random.Random:
    seed = seeds.get(name)
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    print(f"  {name}: seed {seed} (replay with: record.py {name}:{seed})", flush=True)
    return random.Random(seed)


def new_loss_from(job, worker: int, after_seq: int) -> bool:
    return any(
        e.kind == "loss" and e.data.get("worker") == worker
        for e in job.events(from_seq=after_seq, follow=False)
    )


def finish(job, timeout: float = 600) -> dict:
    set_pace(job, FAST)
    final = job.wait(timeout=timeout, progress=False)
    print(f"  ended {final['state']}", flush=True)
    return final


# ---------------------------------------------------------------------- the recordings


def ps_worker_killed(rng: random.Random) -> None:
    """PS, 2 workers + 1 PS, 2 epochs: a worker SIGKILLed (relaunched), then 2 -> 3 -> 2."""
    from tests.integration.faults import pid_of, wait_for, wait_for_step

    job = start(workers=2, ps=1, epochs=2, strategy="ps")
    kill_at, victim = rng.randint(6, 24), rng.randrange(2)
    status = wait_for_step(job, kill_at)
    os.kill(pid_of(status, "worker", victim), signal.SIGKILL)
    print(f"  killed worker {victim} at step {status['step']}", flush=True)
    relaunch = wait_for(lambda: events(job, "relaunch"), 120, "the relaunch", 0.5)[0]
    replacement = relaunch.data["id"]
    wait_for(
        lambda: new_loss_from(job, replacement, relaunch.seq), 120, "the replacement training", 0.5
    )
    print(f"  worker {replacement} replaced it and trains; scaling to 3", flush=True)
    before = len(events(job))
    job.scale(3)
    started = wait_for(
        lambda: [
            e.data["id"]
            for e in job.events(from_seq=before, follow=False)
            if e.kind == "instance" and e.data["role"] == "worker" and e.data["kind"] == "started"
        ],
        60,
        "the added worker",
        0.5,
    )[0]
    wait_for(lambda: new_loss_from(job, started, before), 120, "the added worker training", 0.5)
    print(f"  worker {started} added and trains; scaling to 2", flush=True)
    job.scale(2)
    wait_for(lambda: job.status()["workers"] == 2, 60, "two active workers", 0.5)
    assert finish(job)["state"] == "succeeded"


def allreduce_member_lost(rng: random.Random) -> None:
    """Allreduce, 3 workers: one SIGKILLed; the group shrinks and grows back."""
    from tests.integration.faults import pid_of, wait_for, wait_for_step

    job = start(workers=3, epochs=3, strategy="allreduce")
    kill_at, victim = rng.randint(12, 60), rng.randrange(3)  # minibatches; a step holds 3
    status = wait_for_step(job, kill_at)
    os.kill(pid_of(status, "worker", victim), signal.SIGKILL)
    print(f"  killed worker {victim} at minibatch {status['step']}", flush=True)
    relaunch = wait_for(lambda: events(job, "relaunch"), 120, "the relaunch", 0.5)[0]
    replacement = relaunch.data["id"]

    def joined():
        groups = [e for e in events(job, "group") if e.data.get("reason") == "joined"]
        return [g for g in groups if replacement in g.data.get("joined", [])]

    group = wait_for(joined, 180, "the replacement joining the group", 0.5)[0]
    wait_for(
        lambda: [
            e
            for e in events(job, "group_settled")
            if e.data.get("version") == group.data["version"]
        ],
        120,
        "the grown group stepping",
        0.5,
    )
    print(f"  worker {replacement} joined group v{group.data['version']}", flush=True)
    assert finish(job)["state"] == "succeeded"


def master_restarted(rng: random.Random) -> None:
    """PS: the master SIGKILLed; the supervisor restarts it, it rebuilds from the journal."""
    from tests.integration.faults import wait_for, wait_for_step

    job = start(workers=2, epochs=3, strategy="ps", checkpoint_steps=20)
    status = wait_for_step(job, rng.randint(8, 40))
    old = json.loads((Path(job.dir) / "master.json").read_text())["pid"]
    os.kill(old, signal.SIGKILL)
    print(f"  killed the master (pid {old}) at step {status['step']}", flush=True)
    wait_for(lambda: job.status().get("master_restarts") == 1, 120, "a new master", 0.5)
    wait_for(lambda: job.status().get("state") == "running", 60, "the new master serving", 0.5)
    restarted = wait_for(lambda: events(job, "master_restarted"), 30, "master_restarted", 0.5)[0]
    wait_for(
        lambda: [e for e in job.events(from_seq=restarted.seq, follow=False) if e.kind == "loss"],
        120,
        "training under the new master",
        0.5,
    )
    print(f"  new master: {restarted.data}", flush=True)
    assert finish(job)["state"] == "succeeded"


def straggler(rng: random.Random) -> None:
    """PS, 3 workers: one slowed from outside (SIGSTOP 75 % of the time, as
    test_goodput_and_stragglers does) until flagged, then let go until cleared."""
    from tests.integration.faults import pid_of, wait_for, wait_for_step
    from tests.integration.test_goodput_and_stragglers import SlowDown

    # Tasks of 2 minibatches: a step time is the median of a worker's last 3 tasks, so
    # short tasks flag (and clear) it sooner, in fewer minibatches (a smaller journal).
    job = start(workers=3, epochs=6, strategy="ps", minibatches_per_task=2, evaluate=False)
    victim = rng.randrange(3)
    status = wait_for_step(job, rng.randint(30, 60))
    slow = SlowDown(pid_of(status, "worker", victim))
    try:
        print(f"  slowing worker {victim} from step {status['step']}", flush=True)
        flag = wait_for(lambda: events(job, "straggler"), 120, "a straggler event", 0.5)[0]
        print(f"  flagged {flag.time - slow.started:.1f} s later: {flag.data}", flush=True)
    finally:
        slow.stop()
    cleared = wait_for(lambda: events(job, "straggler_cleared"), 120, "the straggler cleared", 0.5)
    print(f"  cleared: {cleared[0].data}", flush=True)
    assert finish(job)["state"] == "succeeded"


def stopped(rng: random.Random) -> None:
    """PS, 2 workers: stopped by the user (`job.stop()`) mid-training."""
    from tests.integration.faults import wait_for_step

    job = start(workers=2, epochs=3, strategy="ps")
    set_pace(job, 0.1)
    status = wait_for_step(job, rng.randint(10, 60))
    final = job.stop()
    print(f"  stopped at step {status['step']}: {final['state']}", flush=True)
    assert final["state"] == "stopped", final


def ps_killed(rng: random.Random) -> None:
    """PS, 2 workers, checkpoint every 10 steps: the PS SIGKILLed, relaunched, restored."""
    from tests.integration.faults import pid_of, wait_for, wait_for_step

    job = start(workers=2, epochs=3, strategy="ps", checkpoint_steps=10)
    status = wait_for_step(job, rng.randint(15, 50))
    os.kill(pid_of(status, "ps", 0), signal.SIGKILL)
    print(f"  killed the PS at step {status['step']}", flush=True)
    restored = wait_for(lambda: events(job, "ps_restored"), 180, "ps_restored", 0.5)[0]
    wait_for(
        lambda: [e for e in job.events(from_seq=restored.seq, follow=False) if e.kind == "loss"],
        120,
        "training after the restore",
        0.5,
    )
    print(f"  restored: {restored.data}", flush=True)
    assert finish(job)["state"] == "succeeded"


RECORDINGS = {
    f.__name__: f
    for f in (
        ps_worker_killed,
        allreduce_member_lost,
        master_restarted,
        straggler,
        stopped,
        ps_killed,
    )
}


# ---------------------------------------------------------------------- running, summary


def record(name: str, seeds: dict[str, int]) -> None:
    from elasticdl_nb.backends import job_records

    print(f"== {name}", flush=True)
    known = {r.name for r in job_records.all_jobs()}
    began = time.monotonic()
    try:
        RECORDINGS[name](seeded(name, seeds))
    finally:
        _end_jobs()
    [new] = [r for r in job_records.all_jobs() if r.name not in known]
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    for file in COPIED:
        shutil.copyfile(Path(new.files.path) / file, out / file)
    print(f"  recorded in {time.monotonic() - began:.0f} s", flush=True)


def _end_jobs() -> None:
    """Stop every job under this script's home (none should be running by now)."""
    from elasticdl_nb.backends import job_records
    from elasticdl_nb.backends.local import submit

    for rec in job_records.all_jobs():
        if rec.master_alive():
            print(f"  ending job {rec.name}, still running", flush=True)
        submit.kill_job(rec, grace_seconds=2)


def summarize() -> dict[str, list[str]]:
    """Print each journal's event counts and data keys by kind; return the keys of every
    journal here, by kind."""
    every: dict[str, set[str]] = {}
    for path in sorted(HERE.glob("*/events.jsonl")):
        counts: Counter = Counter()
        keys: dict[str, set[str]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                raw = json.loads(line)
                counts[raw["kind"]] += 1
                keys.setdefault(raw["kind"], set()).update(raw["data"])
        size = sum(f.stat().st_size for f in path.parent.iterdir())
        print(f"\n{path.parent.name}: {sum(counts.values())} events, {size / 1024:.0f} KB")
        for kind, n in sorted(counts.items()):
            print(f"  {kind:20} {n:5}  {', '.join(sorted(keys[kind]))}")
            every.setdefault(kind, set()).update(keys[kind])
    return {kind: sorted(keys) for kind, keys in sorted(every.items())}


def main(argv: list[str]) -> int:
    seeds = {}
    names = []
    for arg in argv:
        name, _, seed = arg.partition(":")
        if name not in RECORDINGS:
            print(f"no journal {name!r}; there are: {', '.join(RECORDINGS)}")
            return 2
        names.append(name)
        if seed:
            seeds[name] = int(seed)
    home = Path(tempfile.mkdtemp(prefix="edl-journals-"))
    os.environ["ELASTICDL_NB_HOME"] = str(home)
    failed = []
    try:
        for name in names or list(RECORDINGS):
            try:
                record(name, seeds)
            except Exception:
                traceback.print_exc()
                failed.append(name)
    finally:
        _end_jobs()
        from tests.conftest import job_processes

        left = job_processes(home, every=True)
        for line in left:
            print(f"  killing a leftover: {line[:120]}")
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    keys = summarize()
    (HERE / "keys.json").write_text(json.dumps(keys, indent=1) + "\n")
    if failed:
        print(f"\nnot recorded: {', '.join(failed)} (job files kept in {home})")
        return 1
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
