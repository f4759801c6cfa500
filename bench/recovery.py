"""Recovery: what a SIGKILL of a worker or of the PS costs a running job (issue 3).

    .venv/bin/python bench/recovery.py              # 2 repeats per scenario (6 jobs)
    .venv/bin/python bench/recovery.py --quick      # 1 repeat per scenario (3 jobs)
    .venv/bin/python bench/recovery.py --seed 123   # replay the same kill points

The job: the CTR model of examples/model_zoo/ctr.py on make_ctr_data(153,600), 3 epochs,
2 workers + 1 PS, batch 256, 4 minibatches per task, PS checkpoint every 100 updates,
record_ledger=True: 1,800 steps. Per repeat, one after the other: SIGKILL of a random
worker at a random step; the same job without a kill (the baseline: given more epochs so
that it cannot end early, and stopped BASELINE_WINDOWS windows after the kill's time);
the same kill with no replacement (`max_worker_relaunches=0`: what the kill itself costs
the survivor, without a new worker starting beside it on the two cores); SIGKILL of the
PS at a random step. Kill steps are drawn from 20-35 % of the job's steps
by an RNG seeded with --seed or ELASTICDL_NB_FAULT_SEED (random otherwise; printed), and
a kill also waits until both workers have trained for STEADY (4) seconds.

Timing resolution. The journal's `loss` events are stamped when the master receives a
report; workers report every 0.2 s and at the end of each task, so one event covers
~10-30 steps: too coarse for a gap the size of one step (~10-20 ms). So the job's loss
is wrapped in a tf.py_function that appends time.time() to a file per worker process at
every training step (the compiled train step calls the loss once; the stamp costs
~20 us; the first, a worker's warm-up step before its first task, is left out). Stamps
and journal share the machine's clock; the resolution is one step.

Worker SIGKILL, t_k = the moment of os.kill, from the survivor's step stamps:
  normal step time   median interval between its consecutive steps in [t_k - 3 s, t_k)
  longest gap        the longest such interval that overlaps [t_k, t_k + 5 s];
                     target: longest gap / normal step time <= 2
  survivor rate      its steps in [t_k, t_k + 5 s] / 5 s
  baseline           the same figures for the same worker id in the no-kill job, over
                     the same window counted from the moment both workers have stepped
  replacement        t_k -> the first `loss` event of the worker that replaces the victim
                     (its first minibatch applied and reported; journal time)
  redone             minibatches re-queued from the victim (its `requeue` events)
  epoch barrier      (details) whether the longest gap ended with the next epoch's
                     first tasks, and whose task, of how long, closed the epoch: the
                     master opens an epoch once the one before has ended, and a
                     replacement's first task (its first steps) is slow
  task boundaries    (no-kill job) the median interval into a task's first step over the
                     median step interval: what a gap is without any kill
PS SIGKILL: training resumes at the end of the longest pause of all workers' merged
step stream after t_k (the first step computed with the relaunched PS's parameters);
steps rolled back = `updates_rolled_back` of the `ps_restored` event (newest PS version
the workers reported minus the version restored from the checkpoint); redone =
minibatches re-queued as "not applied on every PS". Each kill job must succeed, and the
ledger in its PS's final checkpoint must hold every record exactly once per epoch
(rows: records applied twice, records never applied; both must be 0).

The details break the recoveries down with the journal and the processes' logs (their
lines carry times to the ms; TensorFlow's import prints a note with an epoch time): when
the master saw the death, when the new process had imported TensorFlow, restored the
checkpoint (PS), reported ready, and when a worker's retry reached the new PS.
Wall time, measured while other benchmarks shared the 2 cores (load average 4-8): quick
~2.6 min, full 4-5 min; most of it is the start-up of the jobs' processes (20-40 s per
job under that load, against ~5 s on a quiet machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import ROOT, log, percentile, pin_threads, row, write_result

pin_threads()  # before TensorFlow: every process of the jobs inherits the pins

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import elasticdl_nb as edl  # noqa: E402
from elasticdl_nb.backends import job_records  # noqa: E402
from elasticdl_nb.backends.local import submit  # noqa: E402
from elasticdl_nb.runtime.master.journal import Event  # noqa: E402
from elasticdl_nb.runtime.ps.ledger import record_counts  # noqa: E402

CASE = "2 workers + 1 PS, CTR"
RECORDS, EPOCHS, BATCH, PER_TASK, CHECKPOINT_STEPS = 153_600, 3, 256, 4, 100
STEPS = RECORDS * EPOCHS // BATCH
BEFORE, WINDOW = 3.0, 5.0  # seconds before a kill (normal step time), after it (gaps, rate)
STEADY = 4.0  # seconds both workers must have trained before a kill
BASELINE_WINDOWS = 4  # the run without a kill lasts this many windows past the kill's time
FAULT_SEED_ENV = "ELASTICDL_NB_FAULT_SEED"


def load_ctr() -> Any:
    spec = importlib.util.spec_from_file_location("ctr", ROOT / "examples/model_zoo/ctr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CTR = load_ctr()


def stamped_loss(loss: Callable, stamp_dir: str) -> Callable:
    """`loss`, plus one wall-clock stamp per training step in <stamp_dir>/<pid>.txt."""

    def loss_with_stamp(labels, predictions):
        import os
        import time

        import tensorflow as tf

        def stamp() -> float:
            if os.environ.get("ELASTICDL_NB_JOB_DIR"):  # a job's worker, not train()'s check
                with open(os.path.join(stamp_dir, f"{os.getpid()}.txt"), "a") as out:
                    out.write(f"{time.time():.6f}\n")
            return 0.0

        mark = tf.py_function(stamp, [], tf.float32)
        return loss(labels, predictions) + 0.0 * tf.reshape(mark, [])

    return loss_with_stamp


# ---------------------------------------------------------------------------- one job


def read_stamps(stamp_dir: Path) -> dict[int, np.ndarray]:
    """{pid: sorted step times}, without each process's first stamp: its warm-up, the
    step a worker runs once before its first task (`Trainer.prepare`), applies nothing."""
    return {
        int(p.stem): np.sort(np.array(p.read_text().split(), dtype=np.float64))[1:]
        for p in stamp_dir.glob("*.txt")
    }


def steady_since(stamp_dir: Path) -> float | None:
    """When both first workers had made a step (None before)."""
    firsts = sorted(s[0] for s in read_stamps(stamp_dir).values() if len(s))
    return firsts[1] if len(firsts) >= 2 else None


def wait_until(job: edl.Job, stamp_dir: Path, step: int, seconds: float) -> dict:
    """Poll until the job is past `step` and both workers have trained `seconds`."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = job.status()
        if status.get("state") not in ("running", "starting", None):
            raise RuntimeError(f"job ended before the kill point: {status.get('state')}")
        steady = steady_since(stamp_dir)
        if status.get("step", 0) >= step and steady and time.time() - steady >= seconds:
            return status
        time.sleep(0.05)
    raise TimeoutError(f"step {step} not reached")


def pid_of(status: dict, role: str, instance_id: int) -> int:
    for inst in status["instances"]:
        if inst["role"] == role and inst["id"] == instance_id and inst["pid"]:
            return inst["pid"]
    raise LookupError(f"no live {role} {instance_id}")


def ledger_counts(job_dir: Path, records: int, epochs: int) -> tuple[int, int]:
    """(records applied more than once, records never applied), summed over epochs, from
    the ledger of PS 0's newest checkpoint (a job of one data source)."""
    counts = record_counts(job_dir, 0, [records])
    twice = sum(int(t.sum()) for (epoch, _), t in counts.items() if epoch >= epochs)
    never = 0
    for epoch in range(epochs):
        tally = counts.get((epoch, 0), np.zeros(records, np.int64))
        twice += int((tally > 1).sum())
        never += int((tally == 0).sum())
    return twice, never


def run_job(
    tag: str,
    data: tuple,
    home: Path,
    kill: str = "",
    at_step: int = 0,
    victim: int = 0,
    stop_after: float | None = None,
    **options: Any,
) -> dict:
    """One job. `kill`: 'worker' or 'ps' to SIGKILL instance `victim` past `at_step`;
    `stop_after`: stop the job that many seconds after both workers have stepped (it gets
    more epochs, so that it cannot end sooner on a fast moment of a shared machine);
    `options`: more of `edl.train`'s."""
    stamp_dir = home / f"stamps-{tag}"
    stamp_dir.mkdir()
    job = edl.train(
        CTR.custom_model,
        loss=stamped_loss(CTR.loss, str(stamp_dir)),
        optimizer=CTR.optimizer,
        data=data,
        workers=2,
        ps=1,
        epochs=EPOCHS if stop_after is None else 5 * EPOCHS,  # the baseline must outlast
        minibatch_size=BATCH,
        minibatches_per_task=PER_TASK,
        checkpoint_steps=CHECKPOINT_STEPS,
        record_ledger=True,
        name=f"recovery-{tag}",
        **options,
    )
    out: dict[str, Any] = {"job": job.name, "kill": kill or "none"}
    try:
        if kill:
            status = wait_until(job, stamp_dir, at_step, STEADY)
            pid = pid_of(status, kill, victim)
            out["t_kill"] = time.time()
            os.kill(pid, signal.SIGKILL)
            out |= {"victim": victim, "kill_step": at_step, "step_at_kill": status["step"]}
            log(f"  SIGKILLed {kill} {victim} (pid {pid}) at step {status['step']}")
        if stop_after is not None:
            wait_until(job, stamp_dir, 0, stop_after)
            out["state"] = job.stop().get("state")
        else:
            try:
                out["state"] = job.wait(timeout=300, progress=False).get("state")
            except edl.JobFailed as exc:
                out["state"], out["error"] = "failed", str(exc)[:1000]
    finally:
        if job.status().get("state") in ("running", "starting"):
            job.stop()
    events = list(job.events(follow=False))
    ids = {
        e.data["pid"]: e.data["id"]
        for e in events
        if e.kind == "instance" and e.data["role"] == "worker" and e.data.get("pid")
    }
    out["stamps"] = {ids[p]: s for p, s in read_stamps(stamp_dir).items() if p in ids}
    out["events"] = events
    out["t_steady"] = steady_since(stamp_dir)
    logs = (job.dir / "logs").glob("*-*.log")  # workers' and PS's
    out["logs"] = {p.stem: p.read_text(errors="replace") for p in logs}
    if kill:
        out["applied_twice"], out["never_applied"] = ledger_counts(job.dir, RECORDS, EPOCHS)
    return out


# ---------------------------------------------------------------------------- analysis


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
TF_INIT = re.compile(r"^I0000 00:00:(\d+\.\d+) ")  # TensorFlow's native start-up lines


def log_lines(text: str, after: float) -> list[tuple[float, str]]:
    """(time, line) of a job log's timed lines from `after` on: ours carry the local time
    to the ms, TensorFlow's 'oneDNN' notes at import an epoch time."""
    out = []
    for line in text.splitlines():
        if m := LOG_TIME.match(line):
            t = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        elif m := TF_INIT.match(line):
            t = float(m[1])
        else:
            continue
        if t >= after:
            out.append((t, line))
    return out


def tf_imported(text: str, after: float) -> float | None:
    """When a process started after `after` printed TensorFlow's last import-time note."""
    times = [t for t, line in log_lines(text, after) if TF_INIT.match(line)]
    return max(times) - after if times else None


def median_ms(seconds: np.ndarray) -> float | None:
    return float(np.median(seconds)) * 1e3 if len(seconds) else None


def gap_figures(ts: np.ndarray, t_from: float) -> dict:
    """One worker's steps around `t_from`: normal step time in the BEFORE seconds, then
    the longest gap and the rate in the WINDOW after. Also the median interval into a
    task's first step and within tasks before `t_from` (all tasks have PER_TASK steps
    before a kill, so a worker's step i starts a task when i % PER_TASK == 0)."""
    ts_before = ts[ts < t_from]
    into = np.diff(ts_before)
    first_of_task = np.arange(1, len(ts_before)) % PER_TASK == 0
    recent = ts_before[1:] >= t_from - BEFORE
    steps = into[recent]
    starts, ends = ts[:-1], ts[1:]
    overlap = (ends > t_from) & (starts < t_from + WINDOW)
    gaps, gap_starts = ends[overlap] - starts[overlap], starts[overlap] - t_from
    soon = gaps[gap_starts < 1.0]
    normal = float(np.median(steps)) if len(steps) > 2 else None
    longest = float(gaps.max()) if len(gaps) else None
    return {
        "normal_step_ms": normal and normal * 1e3,
        "task_boundary_step_ms": median_ms(into[recent & first_of_task]),
        "within_task_step_ms": median_ms(into[recent & ~first_of_task]),
        "p95_step_before_ms": percentile(steps, 95) * 1e3 if len(steps) > 2 else None,
        "longest_gap_before_ms": float(steps.max()) * 1e3 if len(steps) > 2 else None,
        "longest_gap_ms": longest and longest * 1e3,
        "gap_ratio": longest / normal if longest and normal else None,
        "longest_gap_starts_at_s": float(gap_starts[gaps.argmax()]) if len(gaps) else None,
        "longest_gap_first_second_ms": float(soon.max()) * 1e3 if len(soon) else None,
        "steps_per_s": int(((ts >= t_from) & (ts < t_from + WINDOW)).sum()) / WINDOW,
    }


def job_rate(stamps: dict[int, np.ndarray], t_from: float) -> float:
    """Steps per second of all workers together in the WINDOW after `t_from`."""
    steps = sum(int(((s >= t_from) & (s < t_from + WINDOW)).sum()) for s in stamps.values())
    return steps / WINDOW


def first(events: list[Event], what: str, after: float = 0.0, **match: Any) -> Event | None:
    for e in events:
        if e.kind == what and e.time >= after and all(e.data.get(k) == v for k, v in match.items()):
            return e
    return None


def since(event: Event | None, t0: float) -> float | None:
    return None if event is None else event.time - t0


def analyse_worker_kill(run: dict, base: dict | None) -> tuple[dict, dict]:
    """(figures of the kill run, the same figures of the no-kill run `base`)."""
    tk, victim, events = run["t_kill"], run["victim"], run["events"]
    survivor = 1 - victim
    relaunch = first(events, "relaunch", role="worker", replaces=victim)
    new_id = relaunch.data["id"] if relaunch else None
    new_steps = run["stamps"].get(new_id, np.zeros(0))
    killed = first(events, "instance", role="worker", id=victim, kind="killed")
    offset = tk - run["t_steady"]
    ours = {
        "survivor": survivor,
        "kill_at_s_after_steady": offset,
        **gap_figures(run["stamps"][survivor], tk),
        "job_steps_per_s": job_rate(run["stamps"], tk),
        "kill_seen_by_master_s": since(killed, tk),
        "relaunch_s": since(relaunch, tk),
        "replacement_tf_imported_s": tf_imported(run["logs"].get(f"worker-{new_id}", ""), tk),
        "replacement_first_step_s": float(new_steps[0] - tk) if len(new_steps) else None,
        "replacement_first_report_s": since(first(events, "loss", worker=new_id), tk),
        "redone_minibatches": sum(
            e.data["batches"]
            for e in events
            if e.kind == "requeue" and e.data.get("worker") == victim
        ),
    }
    ours |= epoch_barrier(events, tk, ours)
    if base is None:
        return ours, {}
    t_base = base["t_steady"] + offset
    baseline = {
        **gap_figures(base["stamps"][survivor], t_base),
        "job_steps_per_s": job_rate(base["stamps"], t_base),
        "window_longest_gaps_ms": window_maxima(base["stamps"][survivor], base["t_steady"]),
    }
    return ours, baseline


def epoch_barrier(events: list[Event], tk: float, gap: dict) -> dict:
    """Whether the survivor's longest gap after the kill ended with a new epoch (the
    master hands out an epoch's tasks only once the one before has ended), and which
    worker's task ended the old one, how long it took: a replacement's first task is
    slow (its first steps), and when it holds the epoch's last one, the survivor waits."""
    if gap.get("longest_gap_ms") is None:
        return {}
    start = tk + gap["longest_gap_starts_at_s"]
    end = start + gap["longest_gap_ms"] / 1e3
    opened = first(events, "epoch", start)
    if opened is None or opened.time > end + 0.005:
        return {"gap_waited_for_next_epoch": False}
    closing = [e for e in events if e.kind == "worker_time" and e.time <= opened.time]
    last = closing[-1].data if closing else {}
    return {
        "gap_waited_for_next_epoch": True,
        "epoch_closed_by_worker": last.get("worker"),
        "closing_task_s": last.get("task_s"),
    }


def window_maxima(ts: np.ndarray, t_from: float) -> list[float]:
    """The longest gap in each WINDOW-long stretch of a run without a kill, one after
    another from `t_from`: how much the longest gap of one window varies by itself."""
    out = []
    start = t_from
    while start + WINDOW <= ts[-1]:
        inside = ts[(ts >= start) & (ts < start + WINDOW)]
        if len(inside) > 2:
            out.append(float(np.diff(inside).max()) * 1e3)
        start += WINDOW
    return out


def analyse_ps_kill(run: dict) -> dict:
    tk, events = run["t_kill"], run["events"]
    merged = np.sort(np.concatenate(list(run["stamps"].values())))
    starts, ends = merged[:-1], merged[1:]
    pause = int(np.argmax(np.where(ends > tk, ends - starts, -1.0)))
    restored = getattr(first(events, "ps_restored"), "data", None)
    ready = first(events, "instance", after=tk, role="ps", kind="running")
    ps_log = log_lines(run["logs"]["ps-0"], tk)
    retries = [  # (time, delay) of each worker's last failed call to the new PS
        max((t, float(line.split("retrying in ")[1].split()[0])) for t, line in lines)
        for name, text in run["logs"].items()
        if name.startswith("worker")
        and (lines := [(t, x) for t, x in log_lines(text, tk) if "unavailable" in x])
    ]
    return {
        "resume_s": float(ends[pause] - tk),
        "pause_s": float(ends[pause] - starts[pause]),
        "kill_seen_by_master_s": since(first(events, "instance", role="ps", kind="killed"), tk),
        "ps_tf_imported_s": tf_imported(run["logs"]["ps-0"], tk),
        "ps_checkpoint_restored_s": next((t - tk for t, x in ps_log if " restored " in x), None),
        "ps_ready_s": since(ready, tk),
        "first_worker_successful_retry_s": min((t + d - tk for t, d in retries), default=None),
        "first_report_after_ready_s": ready and since(first(events, "loss", ready.time), tk),
        "ps_restored": restored,
        "steps_rolled_back": restored and restored["updates_rolled_back"],
        "master_step_at_kill_minus_restored": restored
        and run["step_at_kill"] - restored["restored_version"],
        "redone_minibatches": sum(
            e.data["batches"]
            for e in events
            if e.kind == "requeue" and e.data.get("reason") == "not applied on every PS"
        ),
    }


def build_rows(runs: dict[str, list[dict]]) -> list[dict]:
    wk, ps, alone = runs["worker"], runs["ps"], runs["worker_alone"]
    a, base, b = [r["ours"] for r in wk], [r["base"] for r in wk], [r["ours"] for r in ps]
    lone, lone_base = [r["ours"] for r in alone], [r["base"] for r in alone]
    windows = [g for x in base for g in x.get("window_longest_gaps_ms", [])]
    boundary = [
        x["task_boundary_step_ms"] / x["normal_step_ms"] if x.get("normal_step_ms") else None
        for x in base
    ]
    w_case, p_case = f"worker SIGKILL, {CASE}", f"PS SIGKILL, {CASE}"
    same = {"baseline_label": "no kill, same worker and window"}

    def col(rows: list[dict], key: str) -> list:
        return [r.get(key) for r in rows]

    return [
        row(
            w_case,
            "longest progress gap / normal step time",
            col(a, "gap_ratio"),
            col(base, "gap_ratio"),
            higher_is_better=False,
            limit=2.0,
            **same,
            note=f"survivor's steps, {WINDOW:.0f} s after the kill; normal = median step "
            f"interval in the {BEFORE:.0f} s before; resolution: one step (stamps)",
        ),
        row(
            f"no kill, {CASE}",
            "interval into a task's first step / normal step time",
            boundary,
            higher_is_better=False,
            limit=2.0,
            note=f"median over the {BEFORE:.0f} s before the window; every {PER_TASK} steps",
        ),
        row(
            w_case,
            "longest progress gap",
            col(a, "longest_gap_ms"),
            col(base, "longest_gap_ms"),
            unit="ms",
            higher_is_better=False,
            **same,
        ),
        row(
            f"{w_case}, no replacement (max_worker_relaunches=0)",
            "longest progress gap",
            col(lone, "longest_gap_ms"),
            col(lone_base, "longest_gap_ms"),
            unit="ms",
            higher_is_better=False,
            **same,
            note="what the kill costs the survivor without a new worker starting beside it",
        ),
        row(
            f"no kill, {CASE}",
            f"longest progress gap of one {WINDOW:.0f} s window",
            windows,
            unit="ms",
            higher_is_better=False,
            note=f"{BASELINE_WINDOWS} windows one after another per run without a kill: "
            "how much one window's longest gap varies by itself",
        ),
        row(
            w_case,
            f"survivor's step rate, {WINDOW:.0f} s after the kill",
            col(a, "steps_per_s"),
            col(base, "steps_per_s"),
            unit="steps/s",
            higher_is_better=True,
            **same,
        ),
        row(
            w_case,
            "time to replacement's first step",
            col(a, "replacement_first_report_s"),
            unit="s",
            higher_is_better=False,
            note="kill -> first loss report of the new worker (first minibatch it applied)",
        ),
        row(w_case, "minibatches redone", col(a, "redone_minibatches"), higher_is_better=False),
        row(
            w_case,
            "records applied twice",
            col(wk, "applied_twice"),
            higher_is_better=False,
            limit=0,
        ),
        row(
            w_case,
            "records never applied",
            col(wk, "never_applied"),
            higher_is_better=False,
            limit=0,
        ),
        row(
            p_case,
            "time until training resumes",
            col(b, "resume_s"),
            unit="s",
            higher_is_better=False,
            note="kill -> first step computed after the PS is back",
        ),
        row(
            p_case,
            "steps rolled back",
            col(b, "steps_rolled_back"),
            higher_is_better=False,
            note=f"ps_restored.updates_rolled_back; checkpoint every {CHECKPOINT_STEPS} updates",
        ),
        row(p_case, "minibatches redone", col(b, "redone_minibatches"), higher_is_better=False),
        row(
            p_case,
            "records applied twice",
            col(ps, "applied_twice"),
            higher_is_better=False,
            limit=0,
        ),
        row(
            p_case,
            "records never applied",
            col(ps, "never_applied"),
            higher_is_better=False,
            limit=0,
        ),
        row(
            f"worker or PS SIGKILL, {CASE}",
            "jobs succeeded",
            [float(r["state"] == "succeeded") for r in wk + ps],
            limit=1.0,
        ),
    ]


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat per scenario")
    parser.add_argument("--seed", type=int, default=None, help=f"or ${FAULT_SEED_ENV}")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else os.environ.get(FAULT_SEED_ENV)
    seed = int(seed) if seed is not None else random.SystemRandom().randrange(2**31)
    log(f"fault seed {seed} (replay with --seed {seed} or {FAULT_SEED_ENV}={seed})")
    rng = random.Random(seed)
    repeats = 1 if args.quick else 2
    tf.get_logger().setLevel("ERROR")  # AutoGraph's note on the cloudpickled loss

    t_start = time.perf_counter()
    home = Path(tempfile.mkdtemp(prefix="edl-recovery-"))
    os.environ["ELASTICDL_NB_HOME"] = str(home)  # the jobs' registry: not ~/.elasticdl-nb
    data = CTR.make_ctr_data(RECORDS)[:2]
    runs: dict[str, list[dict]] = {"worker": [], "worker_alone": [], "none": [], "ps": []}
    failures: list[str] = []

    def attempt(scenario: str, tag: str, *args: Any, **kwargs: Any) -> dict | None:
        try:
            run = run_job(tag, data, home, *args, **kwargs)
        except Exception as exc:  # a failed run is a result: record it and go on
            failures.append(f"{tag}: {type(exc).__name__}: {exc}"[:1000])
            log(f"  -> FAILED {failures[-1]}")
            return None
        if "applied_twice" in run:
            log(
                f"  -> {run['state']}; ledger: {run['applied_twice']} records applied "
                f"twice, {run['never_applied']} never applied"
            )
        runs[scenario].append(run)
        return run

    try:
        for rep in range(repeats):
            lo, hi = int(STEPS * 0.20), int(STEPS * 0.35)
            step, victim = rng.randint(lo, hi), rng.randrange(2)
            log(f"repeat {rep + 1}/{repeats}: SIGKILL worker {victim} past step {step}")
            run = attempt("worker", f"worker-{rep}", "worker", step, victim)
            if run:
                offset = run["t_kill"] - run["t_steady"]
                until = offset + BASELINE_WINDOWS * WINDOW
                log(f"repeat {rep + 1}/{repeats}: no kill (until {until:.1f} s)")
                run["base_run"] = attempt("none", f"none-{rep}", stop_after=until)
            log(f"repeat {rep + 1}/{repeats}: SIGKILL worker {victim}, no replacement")
            lone = attempt(
                "worker_alone", f"alone-{rep}", "worker", step, victim, max_worker_relaunches=0
            )
            if lone and run and run.get("base_run"):
                lone["base_run"] = run["base_run"]
            step = rng.randint(lo, hi)
            log(f"repeat {rep + 1}/{repeats}: SIGKILL the PS past step {step}")
            attempt("ps", f"ps-{rep}", "ps", step)
    finally:
        for record in job_records.all_jobs():  # nothing may outlive the benchmark
            submit.kill_job(record, grace_seconds=2)
        shutil.rmtree(home, ignore_errors=True)
    elapsed = time.perf_counter() - t_start

    for run in runs["worker"] + runs["worker_alone"]:
        run["ours"], run["base"] = analyse_worker_kill(run, run.pop("base_run", None))
        log(f"worker kill: {run['ours']}\n  no kill, same window: {run['base']}")
    for run in runs["ps"]:
        run["ours"] = analyse_ps_kill(run)
        log(f"PS kill: {run['ours']}")

    keep = (
        "job",
        "kill",
        "state",
        "error",
        "victim",
        "kill_step",
        "step_at_kill",
        "applied_twice",
        "never_applied",
        "ours",
        "base",
    )
    details = {
        "seed": seed,
        "failures": failures,
        "job": {
            "model": "examples/model_zoo/ctr.py",
            "records": RECORDS,
            "epochs": EPOCHS,
            "steps": STEPS,
            "batch": BATCH,
            "minibatches_per_task": PER_TASK,
            "checkpoint_steps": CHECKPOINT_STEPS,
            "workers": 2,
            "ps": 1,
            "record_ledger": True,
        },
        "window_s": {"before": BEFORE, "after": WINDOW, "steady_before_kill": STEADY},
        "timing_resolution": "one training step: each worker stamps time.time() from a "
        "tf.py_function in the loss; the journal's loss events come only every ~0.2 s",
        "runs": {k: [{f: r[f] for f in keep if f in r} for r in v] for k, v in runs.items()},
    }
    command = ".venv/bin/python bench/recovery.py" + (" --quick" if args.quick else "")
    write_result(
        "recovery",
        "Recovery from a SIGKILL of a worker or the PS",
        build_rows(runs),
        details,
        command=command,
        seconds=round(elapsed, 1),
    )
    log(f"benchmark time {elapsed:.0f} s (seed {seed})")


if __name__ == "__main__":
    sys.exit(main())
