"""Training throughput: plain Keras `model.fit` in one process vs an elasticdl-nb job.

    .venv/bin/python bench/throughput.py            # full run (~5-6 min on 2 cores)
    .venv/bin/python bench/throughput.py --quick    # smaller, one repetition (~2 min)

For each model (the digits MLP and the CTR model of examples/model_zoo/ctr.py) it runs,
alternating so that slow phases of a noisy machine hit both sides:

  baseline  plain Keras: model.compile(optimizer, loss) + model.fit(x, y, batch_size=B,
            epochs=E, verbose=0) in this process. Keras defaults otherwise
            (jit_compile='auto' resolves to False on this CPU-only machine,
            steps_per_execution=1, shuffle=True). Measured: records of epochs 2..E divided
            by the wall time from the end of epoch 1 to the end of epoch E (a callback
            stamps every on_epoch_end), so the first epoch's tracing is excluded.
  ours      edl.train(..., workers=W, ps=1, epochs=E, minibatch_size=B) with the same
            model functions, data, optimizer and batch size. Measured from the job's
            journal: let F be the first 'loss' event (for W>1: the first one after every
            worker has sent one) and L the last one; each 'loss' event's last point
            carries the global step (minibatches applied so far). Throughput =
            (step(L) - step(F)) * B / (time(L) - time(F)). This excludes the start-up
            (process launch, TensorFlow import, model build, PS init) and the export at
            the end, and includes everything the worker does between minibatches in
            steady state: probe, pull, train step, push, task fetches, PS checkpoints.
            All minibatches are full (record counts are multiples of B * tasks), so
            steps * B is exact.

Samples/s are reported per run; the table shows the median. Ratio = median(ours) /
median(baseline) at the same batch size B (stated in the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from code_state import code_state  # bench/code_state.py, beside this script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quieter logs only; no effect on speed

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CONFIGS = [  # (key, label) of the job configurations, in table order
    ("ours_1w", "1 worker + 1 PS"),
    ("ours_2w", "2 workers + 1 PS"),
    ("ours_1w_overlap", "1 worker + 1 PS, overlap"),
]
CTR_TARGET = 0.8  # the target: ours/baseline >= 0.8 for CTR at 1 worker + 1 PS

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import elasticdl_nb as edl  # noqa: E402


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------- models


def digits_model():
    inputs = tf.keras.Input(shape=(64,), name="pixels")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inputs)
    logits = tf.keras.layers.Dense(10, name="logits")(hidden)
    return tf.keras.Model(inputs, logits, name="digits_mlp")


def digits_loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def digits_optimizer():
    return tf.keras.optimizers.Adam(learning_rate=0.001)


def load_ctr_module():
    spec = importlib.util.spec_from_file_location("ctr", ROOT / "examples/model_zoo/ctr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digits_data(n_train: int):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order][:n_train], y[order][:n_train]
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


# ---------------------------------------------------------------------------- runs


class _EpochStamps(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begin = None
        self.ends: list[float] = []
        self.epoch_begins: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_begins.append(time.perf_counter())

    def on_train_begin(self, logs=None):
        self.begin = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())


def run_baseline(case: dict) -> dict:
    tf.keras.backend.clear_session()
    model = case["model"]()
    model.compile(optimizer=case["optimizer"](), loss=case["loss"])
    stamps = _EpochStamps()
    x, y = case["data"]
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    model.fit(x, y, batch_size=case["batch"], epochs=case["epochs"], verbose=0, callbacks=[stamps])
    total = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    timed_epochs = len(stamps.ends) - 1
    window = stamps.ends[-1] - stamps.ends[0]
    records = timed_epochs * len(x)
    inside = sum(e - b for b, e in zip(stamps.epoch_begins[1:], stamps.ends[1:]))
    return {
        "inside_epochs_samples_per_s": records / inside,  # information: no between-epoch gaps
        "samples_per_s": records / window,
        "window_s": window,
        "records": records,
        "first_epoch_s": stamps.ends[0] - stamps.begin,
        "total_s": total,
        "cpu_per_wall": cpu / total,  # cores this process got on average (2 at most)
        "loadavg_1m": os.getloadavg()[0],
        "jit_compile": bool(model.jit_compile),
    }


def _steady_state(events: list, workers: int, batch: int, per_task: int) -> dict:
    losses = [e for e in events if e.kind == "loss"]
    if len(losses) < 2:
        raise RuntimeError(f"only {len(losses)} 'loss' events: the job was too short to measure")
    seen: set = set()
    start = 0
    for i, e in enumerate(losses):  # the window opens once every worker has reported
        seen.add(e.data.get("worker", 0))
        if len(seen) >= workers:
            start = i
            break
    first, last = losses[start], losses[-1]
    step0, step1 = first.data["points"][-1][0], last.data["points"][-1][0]
    window = last.time - first.time
    states = [e for e in events if e.kind == "job_state"]
    t_begin = states[0].time
    t_end = states[-1].time
    final_step = step1
    # Information: the same window opened later, at the first 'loss' event past 3 tasks'
    # worth of steps, which leaves out the worker's first tf.function (re)tracings.
    warm = next(
        (e for e in losses[start:] if e.data["points"][-1][0] >= step0 + 3 * per_task), None
    )
    warm_rate = None
    if warm is not None and last.time > warm.time:
        warm_step = warm.data["points"][-1][0]
        warm_rate = (step1 - warm_step) * batch / (last.time - warm.time)
    return {
        "warm_samples_per_s": warm_rate,
        "samples_per_s": (step1 - step0) * batch / window,
        "window_s": window,
        "records": (step1 - step0) * batch,
        "steps_in_window": step1 - step0,
        "loss_events": len(losses) - start,
        "startup_s": losses[0].time - t_begin,  # 'running' -> first loss event
        "job_s": t_end - t_begin,  # 'running' -> final job_state (incl. export)
        "whole_job_samples_per_s": final_step * batch / (t_end - t_begin),
    }


def run_ours(case: dict, workers: int, tag: str, **extra) -> dict:
    name = f"bench-{case['key']}-{workers}w-{tag}"
    t0 = time.perf_counter()
    job = edl.train(
        case["model"],
        loss=case["loss"],
        optimizer=case["optimizer"],
        data=case["data"],
        workers=workers,
        ps=1,
        epochs=case["epochs"],
        minibatch_size=case["batch"],
        minibatches_per_task=case["per_task"],
        name=name,
        **extra,
    )
    t_submitted = time.perf_counter() - t0
    try:
        status = job.wait(timeout=case["timeout"], progress=False)
    except TimeoutError:
        job.stop()
        raise
    wall = time.perf_counter() - t0
    events = list(job.events(follow=False))
    out = _steady_state(events, workers, case["batch"], case["per_task"])
    out.update(
        {
            "job": name,
            "state": status.get("state"),
            "steps": status.get("step"),
            "train_call_s": t_submitted,
            "wall_s": wall,
            "master_records_per_second": status.get("records_per_second"),
            "loadavg_1m": os.getloadavg()[0],
        }
    )
    return out


# ---------------------------------------------------------------------------- report


def _machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    commit = code_state()
    import grpc
    import keras
    import sklearn

    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "scikit-learn": sklearn.__version__,
        "elasticdl_nb": edl.__version__,
        "git_commit": commit,
    }


def _median(runs: list[dict]) -> float | None:
    values = [r["samples_per_s"] for r in runs if "samples_per_s" in r]
    return statistics.median(values) if values else None


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def build_summary(cases: list[dict], results: dict) -> list[dict]:
    rows = []
    for case in cases:
        r = results[case["key"]]
        base = _median(r["baseline"])
        for key, label in CONFIGS:
            runs = r[key]
            if not runs:
                continue
            ours = _median(runs)
            ratio = ours / base if ours and base else None
            row = {
                "model": case["title"],
                "config": label,
                "batch": case["batch"],
                "epochs": case["epochs"],
                "records": len(case["data"][0]),
                "baseline_samples_per_s": base,
                "baseline_runs": [round(x["samples_per_s"]) for x in r["baseline"]],
                "ours_samples_per_s": ours,
                "ours_runs": [round(x["samples_per_s"]) for x in runs if "samples_per_s" in x],
                "ratio": ratio,
            }
            if case["key"] == "ctr" and key == "ours_1w":
                row["target"] = CTR_TARGET
                row["target_met"] = bool(ratio is not None and ratio >= CTR_TARGET)
            rows.append(row)
    return rows


def render_markdown(machine: dict, command: str, rows: list[dict], results: dict, cases) -> str:
    lines = [
        "# Throughput: elasticdl-nb vs plain Keras `model.fit`",
        "",
        f"- Date: {machine['date']}",
        f"- Command: `{command}`",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, "
        f"{machine['platform']}; load average at start {machine['loadavg_at_start']}",
        f"- Versions: Python {machine['python']}, TensorFlow {machine['tensorflow']}, "
        f"Keras {machine['keras']}, NumPy {machine['numpy']}, grpcio {machine['grpcio']}, "
        f"scikit-learn {machine['scikit-learn']}, elasticdl-nb {machine['elasticdl_nb']} "
        f"(code: git {machine['git_commit'] or '?'})",
        "",
        "Same model functions, data, optimizer, epochs and **the same batch size** on both "
        "sides (one gradient step per minibatch, one round trip to the PS per step on ours). "
        "Values are samples (records) per second, median of the runs listed.",
        "",
        "| model | config | batch | epochs | records | baseline fit (runs) | ours (runs) "
        "| ours / baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.3f}"
        if "target" in row:
            ratio += f" (target ≥ {row['target']}: {'met' if row['target_met'] else 'NOT met'})"
        lines.append(
            f"| {row['model']} | {row['config']} | {row['batch']} | {row['epochs']} "
            f"| {row['records']:,} | {_fmt(row['baseline_samples_per_s'])} "
            f"({', '.join(f'{v:,}' for v in row['baseline_runs'])}) "
            f"| {_fmt(row['ours_samples_per_s'])} "
            f"({', '.join(f'{v:,}' for v in row['ours_runs'])}) | {ratio} |"
        )
    lines += ["", "## Details per run", ""]
    for case in cases:
        r = results[case["key"]]
        lines.append(f"### {case['title']}")
        lines.append("")
        for b in r["baseline"]:
            lines.append(
                f"- baseline: {b['samples_per_s']:,.0f} samples/s over {b['window_s']:.2f} s "
                f"(epochs 2..{case['epochs']}; {b['inside_epochs_samples_per_s']:,.0f} counting "
                f"only the time inside epochs); first epoch {b['first_epoch_s']:.2f} s; "
                f"process CPU {b['cpu_per_wall']:.2f} cores; load {b['loadavg_1m']:.1f}; "
                f"jit_compile={b['jit_compile']}"
            )
        for key, _ in CONFIGS:
            for o in r[key]:
                if "error" in o:
                    lines.append(f"- {key}: FAILED: {o['error']}")
                    continue
                lines.append(
                    f"- {key} `{o['job']}`: {o['samples_per_s']:,.0f} samples/s steady state "
                    f"({o['steps_in_window']} steps in {o['window_s']:.2f} s between "
                    f"{o['loss_events']} loss events; "
                    f"{_fmt(o.get('warm_samples_per_s'))} from 3 tasks after the first loss "
                    f"event); start-up to first loss "
                    f"{o['startup_s']:.1f} s; job {o['job_s']:.1f} s "
                    f"(whole-job {o['whole_job_samples_per_s']:,.0f} samples/s); "
                    f"wall incl. edl.train() {o['wall_s']:.1f} s; load {o['loadavg_1m']:.1f}"
                )
        lines.append("")
    lines += [
        "## What is measured",
        "",
        "- **baseline**: `model.compile(optimizer, loss)` and `model.fit(x, y, batch_size=B, "
        "epochs=E, verbose=0)` in the benchmark process (Keras defaults: jit_compile "
        "resolves to False on CPU, steps_per_execution=1, shuffle=True). Records of epochs "
        "2..E / wall time from the end of epoch 1 to the end of epoch E.",
        "- **ours**: `edl.train(..., workers=W, ps=1, epochs=E, minibatch_size=B)` on local "
        "processes (master, PS and workers are separate processes on the same 2 cores). "
        "From the job's journal: (global step of the last 'loss' event − global step of the "
        "first 'loss' event) × B / (time of the last − time of the first). With W>1 the "
        "window opens at the first 'loss' event after every worker has reported. Start-up "
        "(process launch, TensorFlow import, model build, PS init) and the final export are "
        "excluded; task fetches, probes, pulls, pushes and PS checkpoints are included. "
        "The details also show the rate with the window opened 3 tasks later, which leaves "
        "out the worker's first tf.function retracings (~1 s in the first seconds).",
        "- **overlap** (if the runtime has the option): the same job with "
        "`overlap_communication=True`, where a step's push and the pull for the step after "
        "next travel while the worker computes, so gradients use parameters one update old. "
        "Not the same algorithm as the exact mode; the target is judged on the exact mode.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller run, one repetition")
    parser.add_argument("--keep-jobs", action="store_true", help="keep the jobs' directories")
    parser.add_argument("--no-2w", action="store_true", help="skip the 2-worker runs")
    args = parser.parse_args()
    command = ".venv/bin/python bench/throughput.py" + (" --quick" if args.quick else "")

    home = tempfile.mkdtemp(prefix="edl-bench-")
    os.environ["ELASTICDL_NB_HOME"] = home
    ctr = load_ctr_module()
    machine = _machine()
    _log(f"jobs under {home}; load average {machine['loadavg_at_start']}")

    # All minibatches full: records = multiple of batch * minibatches_per_task.
    if args.quick:
        digits_n, digits_epochs, ctr_n, ctr_epochs, reps = 1408, 60, 102_400, 3, 1
    else:
        digits_n, digits_epochs, ctr_n, ctr_epochs, reps = 1408, 100, 204_800, 3, 2
    two_workers = not args.quick
    if args.no_2w:
        two_workers = False
    ctr_ids, ctr_clicks, _ = ctr.make_ctr_data(ctr_n)
    cases = [
        {
            "key": "digits",
            "title": "digits MLP (64-64-10, Adam)",
            "model": digits_model,
            "loss": digits_loss,
            "optimizer": digits_optimizer,
            "data": digits_data(digits_n),
            "batch": 64,
            "per_task": 11,  # 2 tasks of 704 records per epoch
            "epochs": digits_epochs,
            "timeout": 240,
        },
        {
            "key": "ctr",
            "title": "CTR (4×Embedding(10000,16)-64-32-1, Adagrad)",
            "model": ctr.custom_model,
            "loss": ctr.loss,
            "optimizer": ctr.optimizer,
            "data": (ctr_ids, ctr_clicks),
            "batch": 256,
            "per_task": 8,  # the default
            "epochs": ctr_epochs,
            "timeout": 300,
        },
    ]
    for case in cases:
        n = len(case["data"][0])
        assert n % (case["batch"] * case["per_task"]) == 0, (case["key"], n)

    results = {c["key"]: {"baseline": []} | {k: [] for k, _ in CONFIGS} for c in cases}
    overlap = "overlap_communication" in {f.name for f in dataclasses.fields(edl.JobSpec)}
    t_start = time.perf_counter()
    for case in cases:
        r = results[case["key"]]
        for rep in range(reps):
            _log(f"{case['key']}: baseline fit, run {rep + 1}/{reps}")
            b = run_baseline(case)
            r["baseline"].append(b)
            _log(f"  -> {b['samples_per_s']:,.0f} samples/s over {b['window_s']:.2f} s")
            _log(f"{case['key']}: ours 1 worker + 1 PS, run {rep + 1}/{reps}")
            try:
                o = run_ours(case, 1, f"r{rep}")
                _log(
                    f"  -> {o['samples_per_s']:,.0f} samples/s over {o['window_s']:.1f} s "
                    f"(start-up {o['startup_s']:.1f} s, wall {o['wall_s']:.1f} s)"
                )
            except Exception as exc:  # record it and go on: a failed run is a result too
                o = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                _log(f"  -> FAILED {o['error'][:300]}")
            r["ours_1w"].append(o)
        if two_workers:
            _log(f"{case['key']}: ours 2 workers + 1 PS")
            try:
                o = run_ours(case, 2, "r0")
                _log(f"  -> {o['samples_per_s']:,.0f} samples/s over {o['window_s']:.1f} s")
            except Exception as exc:
                o = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                _log(f"  -> FAILED {o['error'][:300]}")
            r["ours_2w"].append(o)
        if two_workers and overlap and case["key"] == "ctr":
            _log(f"{case['key']}: ours 1 worker + 1 PS, overlap_communication=True")
            try:
                o = run_ours(case, 1, "ov", overlap_communication=True)
                _log(f"  -> {o['samples_per_s']:,.0f} samples/s over {o['window_s']:.1f} s")
            except Exception as exc:
                o = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                _log(f"  -> FAILED {o['error'][:300]}")
            r["ours_1w_overlap"].append(o)
        if reps > 1:  # one more baseline after the jobs, so it brackets them in time
            _log(f"{case['key']}: baseline fit, closing run")
            b = run_baseline(case)
            r["baseline"].append(b)
            _log(f"  -> {b['samples_per_s']:,.0f} samples/s over {b['window_s']:.2f} s")
    elapsed = time.perf_counter() - t_start

    rows = build_summary(cases, results)
    print()
    header = (
        f"{'model':<48} {'config':<25} {'batch':>5} {'baseline/s':>11} {'ours/s':>9} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(
            f"{row['model']:<48} {row['config']:<25} {row['batch']:>5} "
            f"{_fmt(row['baseline_samples_per_s']):>11} {_fmt(row['ours_samples_per_s']):>9} "
            f"{ratio:>6}"
        )
    for row in rows:
        if "target" in row:
            verdict = "MET" if row["target_met"] else "NOT MET"
            ratio = "—" if row["ratio"] is None else f"{row['ratio']:.3f}"
            print(
                f"\nCTR target ours/baseline >= {row['target']} at 1 worker + 1 PS, "
                f"batch {row['batch']} on both sides: {ratio} -> {verdict}"
            )
    print(f"benchmark time {elapsed:.0f} s")

    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command,
        "machine": machine,
        "benchmark_seconds": round(elapsed, 1),
        "measured": {
            "baseline": "records of epochs 2..E / (t_end(epoch E) - t_end(epoch 1)), "
            "plain model.fit in one process",
            "ours": "(step(last loss event) - step(first loss event)) * batch / "
            "(time(last) - time(first)) from the job's journal; W>1: window opens when "
            "every worker has reported",
        },
        "cases": [
            {k: v for k, v in c.items() if k in ("key", "title", "batch", "per_task", "epochs")}
            | {"records": len(c["data"][0])}
            for c in cases
        ],
        "summary": rows,
        "runs": results,
    }
    (RESULTS / "throughput.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    with open(RESULTS / "throughput_history.jsonl", "a") as history:  # every run, for spread
        brief = {
            "date": machine["date"],
            "command": command,
            "code": machine["git_commit"],
            "loadavg_at_start": machine["loadavg_at_start"],
            "loadavg_at_end": list(os.getloadavg()),
            "summary": rows,
        }
        history.write(json.dumps(brief, default=str) + "\n")
    (RESULTS / "throughput.md").write_text(render_markdown(machine, command, rows, results, cases))
    _plot(rows)
    _log(f"wrote {RESULTS / 'throughput.json'} and {RESULTS / 'throughput.md'}")
    if not args.keep_jobs:
        shutil.rmtree(home, ignore_errors=True)


def _plot(rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return  # no matplotlib in the venv: no chart
    labels = [f"{r['model'].split(' (')[0]}\n{r['config']}" for r in rows]
    base = [r["baseline_samples_per_s"] or 0 for r in rows]
    ours = [r["ours_samples_per_s"] or 0 for r in rows]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(xs - 0.2, base, 0.4, label="Keras fit, 1 process")
    ax.bar(xs + 0.2, ours, 0.4, label="elasticdl-nb")
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("samples/s")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "throughput.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
