"""Benchmark 1: training throughput of our PS job against single-process Keras `model.fit`.

    .venv/bin/python bench/throughput.py [--quick] [--only ctr,digits,cnn]

For each workload of bench/workloads.py (digits MLP, CTR with embeddings, small CNN), with
the same model functions, data, optimizer, epochs and batch size on both sides, runs
alternate so that slow phases of a noisy machine hit both sides:

    fit, ours 1 worker + 1 PS, ours 2 workers + 1 PS, fit, ours 1+1, ours 2+1, fit

- fit: `workloads.run_fit` — records of epochs 2..E / wall time from the end of epoch 1 to
  the end of epoch E, in this process.
- ours: `workloads.run_job` — steady-state samples/s from the job's journal (start-up and
  export left out; task hand-outs, pulls, pushes and PS checkpoints inside the window).
- digits and CNN also run with the allreduce strategy (2 workers, no PS: every step the
  workers average their gradients, synchronously; issue 7), compared with 2 workers + 1 PS.
- CTR 1 worker + 1 PS also runs with `overlap_communication=True` (each step's exchange
  on its way while the next step computes, gradients on parameters one update old:
  another algorithm, so a row of its own beside the exact mode, without a target).

Each of the job's processes (master, PS, workers) is pinned to one TensorFlow intra-op and
one inter-op thread (bench/harness.py), so they split the 2 cores instead of
oversubscribing them; the single-process baseline, alone on the machine, gets 2 intra-op
and 2 inter-op threads, TensorFlow's own choice here.

Target (issue 3): ours / fit >= 0.8 for CTR at 1 worker + 1 PS. Beside it, the series
bound of that job on this machine (`bench/profile_step.py --bound`, in every repetition
of the CTR runs): the worker's compiled step, the PS's compiled update and table rows and one
step-sized round trip, each measured alone, one after another, as a worker and a PS
take turns in exact mode; as samples/s against the same `fit` runs. It says how much of
`fit`'s speed the two processes could reach at all, with none of our Python around them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import harness

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)

CTR_TARGET = 0.8
CONFIGS = [(1, "1 worker + 1 PS"), (2, "2 workers + 1 PS")]
BASELINE = "Keras 3 model.fit, 1 process"
ALLREDUCE = "2 workers, allreduce"
OVERLAP = "overlap_communication"


def _attempt(what: str, fn, *args, **kwargs) -> dict:
    """Run one measurement; a failure is recorded as a result and the benchmark goes on."""
    harness.log(what)
    try:
        out = fn(*args, **kwargs)
        harness.log(f"  -> {out['samples_per_s']:,.0f} samples/s")
        return out
    except Exception as exc:
        harness.log(f"  -> FAILED {type(exc).__name__}: {exc}"[:400])
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def _rates(runs: list[dict]) -> list[float]:
    return [r["samples_per_s"] for r in runs if "samples_per_s" in r]


def measure(
    w: workloads.Workload, reps: int, overlap: bool, allreduce: bool, bound: bool = False
) -> tuple[list[dict], dict]:
    fit: list[dict] = []
    bounds: list[dict] = []
    ours: dict[int, list[dict]] = {n: [] for n, _ in CONFIGS}
    ring: list[dict] = []
    overlapped: list[dict] = []
    for rep in range(reps):
        fit.append(_attempt(f"{w.key}: fit, run {rep + 1}", workloads.run_fit, w))
        for n, label in CONFIGS:
            what = f"{w.key}: ours {label}, run {rep + 1}"
            ours[n].append(_attempt(what, workloads.run_job, w, n, f"r{rep}"))
        if allreduce:
            what = f"{w.key}: ours {ALLREDUCE}, run {rep + 1}"
            ring.append(_attempt(what, workloads.run_job, w, 2, f"r{rep}", strategy="allreduce"))
        if overlap:
            what = f"{w.key}: ours {CONFIGS[0][1]}, {OVERLAP}, run {rep + 1}"
            overlapped.append(
                _attempt(what, workloads.run_job, w, 1, f"o{rep}", overlap_communication=True)
            )
        if bound:  # (measured in every repetition: the machine's speed drifts)
            what = (
                f"{w.key}: series bound of {CONFIGS[0][1]} (profile_step.py --bound), run {rep + 1}"
            )
            bounds.append(_attempt(what, series_bound, w))
    fit.append(_attempt(f"{w.key}: fit, closing run", workloads.run_fit, w))
    rows = []
    for n, label in CONFIGS:
        rows.append(
            harness.row(
                f"{w.title}, {label}",
                "samples/s",
                _rates(ours[n]),
                _rates(fit),
                unit="samples/s",
                baseline_label=BASELINE,
                target=CTR_TARGET if (w.key == "ctr" and n == 1) else None,
                note=f"batch {w.batch}, {w.epochs} epochs of {w.records:,} records",
            )
        )
    details = {"fit": fit, "ours": {str(n): runs for n, runs in ours.items()}}
    if allreduce:  # issue 7: the two strategies side by side, 2 workers each
        rows.append(
            harness.row(
                f"{w.title}, {ALLREDUCE}",
                "samples/s",
                _rates(ring),
                _rates(ours[2]),
                unit="samples/s",
                baseline_label="ours, 2 workers + 1 PS",
                note=f"batch {w.batch} per worker, {w.epochs} epochs of {w.records:,} records",
            )
        )
        details["ours_allreduce_2w"] = ring
    if overlap:
        rows.insert(
            1,
            harness.row(
                f"{w.title}, {CONFIGS[0][1]}, {OVERLAP}",
                "samples/s",
                _rates(overlapped),
                _rates(fit),
                unit="samples/s",
                baseline_label=BASELINE,
                note="parameters one update old: another algorithm than the exact row above",
            ),
        )
        details["ours_overlap_1w"] = overlapped
    if bound:
        parts = [b for b in bounds if "parts_us" in b]
        median = {  # µs per step of each part, the median over the runs
            name: statistics.median(b["parts_us"][name] for b in parts)
            for name in (parts[0]["parts_us"] if parts else {})
        }
        round_trip = statistics.median(b["round_trip_us"] for b in parts) if parts else 0.0
        rows.insert(
            1,
            harness.row(
                f"{w.title}, {CONFIGS[0][1]}: series bound",
                "samples/s",
                _rates(bounds),
                _rates(fit),
                unit="samples/s",
                baseline_label=BASELINE,
                note="median µs per step: "
                + ", ".join(f"{k} {v:,.0f}" for k, v in median.items())
                + f", round trip {round_trip:,.0f}",
            ),
        )
        details["series_bound"] = bounds
    return rows, details


def series_bound(w: workloads.Workload) -> dict:
    """One measurement of the series bound of CTR 1 worker + 1 PS (see the docstring)."""
    done = subprocess.run(
        [
            harness.PY,
            str(harness.ROOT / "bench" / "profile_step.py"),
            "--bound",
            "--batch",
            str(w.batch),
            "--per-task",
            str(w.per_task),
        ],
        capture_output=True,
        text=True,
        env=harness.pinned_env(),
        timeout=600,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("SERIES_BOUND ")), None)
    if line is None:
        raise RuntimeError(f"profile_step.py --bound printed no bound: {done.stderr[-2000:]}")
    return json.loads(line.split(" ", 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs, one repetition")
    parser.add_argument("--only", default="digits,ctr,cnn", help="workloads, comma-separated")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with harness.job_home():
        all_workloads = workloads.workloads(args.quick)
        rows, details = [], {}
        for key in args.only.split(","):
            w = all_workloads[key]
            ctr = key == "ctr"
            w_rows, details[key] = measure(
                w, 1 if args.quick else 2, ctr, key in ("digits", "cnn"), bound=ctr
            )
            rows += w_rows
    harness.write_result(
        "throughput",
        "Training throughput: our PS job vs single-process Keras fit",
        rows,
        details,
        command=" ".join([".venv/bin/python bench/throughput.py", *sys.argv[1:]]),
        seconds=time.perf_counter() - t0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
