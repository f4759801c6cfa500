"""Benchmark 7: the scaling curve, 1 → 2 → 4 workers (1 PS) on the CTR model.

    .venv/bin/python bench/scaling.py [--quick]

For each worker count W, runs the CTR workload of bench/workloads.py (its smaller data set:
3 epochs of 102,400 records) as an elasticdl-nb job with W workers and 1 PS (repeats
alternate W = 1, 2, 4) and reports:

- samples/s in steady state (`workloads.steady_state`: from the journal, start-up and
  export left out), and the speed-up over W = 1 (the ratio column);
- the communication share: of the workers' time on training tasks, the part spent blocked
  waiting for PS replies (the `worker_time` journal events: sum(wait_s) / sum(task_s)); the
  rest is the train step (compute_s) and the worker's own Python.

All processes share this machine's 2 cores (thread pins as in bench/harness.py), so beyond
2 busy processes the curve measures contention, not the system's scalability; the PS is a
single process that serves every worker in turn.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import harness

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)

WORKERS = (1, 2, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    args = parser.parse_args()
    t0 = time.perf_counter()
    runs: dict[int, list[dict]] = {w: [] for w in WORKERS}
    with harness.job_home():
        # The smaller CTR data set (3 epochs of 102,400 records) keeps make bench short.
        ctr = workloads.workloads(quick=True)["ctr"]
        for rep in range(1 if args.quick else 2):
            for w in WORKERS:
                harness.log(f"CTR, {w} workers + 1 PS, run {rep + 1}")
                try:
                    run = workloads.run_job(ctr, w, f"scale{rep}")
                    harness.log(
                        f"  -> {run['samples_per_s']:,.0f} samples/s, communication "
                        f"{run['communication_share']:.0%}"
                    )
                except Exception as exc:
                    run = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                    harness.log(f"  -> FAILED {run['error'][:300]}")
                runs[w].append(run)

    def rates(w: int) -> list[float]:
        return [r["samples_per_s"] for r in runs[w] if "samples_per_s" in r]

    rows = []
    for w in WORKERS:
        rows.append(
            harness.row(
                f"CTR, {w} worker{'s' if w > 1 else ''} + 1 PS",
                "samples/s (ratio: speed-up over 1 worker)",
                rates(w),
                rates(1) if w > 1 else None,
                unit="samples/s",
                baseline_label="1 worker + 1 PS",
            )
        )
        rows.append(
            harness.row(
                f"CTR, {w} worker{'s' if w > 1 else ''} + 1 PS",
                "communication share of the workers' task time",
                [r["communication_share"] for r in runs[w] if r.get("communication_share")],
                higher_is_better=False,
            )
        )
    harness.write_result(
        "scaling",
        "Scaling curve: CTR with 1, 2, 4 workers and 1 PS",
        rows,
        {"runs": {str(w): rs for w, rs in runs.items()}, "cores": os.cpu_count()},
        command=" ".join([".venv/bin/python bench/scaling.py", *sys.argv[1:]]),
        seconds=time.perf_counter() - t0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
