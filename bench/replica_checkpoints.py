"""What the allreduce replicas' checkpoints cost the step (issue 16): the same job with a
checkpoint every step against none, in one run.

    .venv/bin/python bench/replica_checkpoints.py [--quick]

The digits MLP of bench/workloads.py, 3 workers with the allreduce strategy, every process
pinned to one thread (bench/harness.py). Alternating, `repeats` times each:

- ours: `checkpoint_steps=10` and `checkpoint_steps=1`, the worst case: the group's
  first member copies its replica's state on the step and a thread of its own writes it
  (one write at a time, and the writer keeps to 2 % of the time: a checkpoint that comes
  due sooner is skipped; the figure "job seconds per checkpoint" says how often one was
  taken, so how far back a loss of every replica goes);
- baseline: `checkpoint_steps` larger than the job: no checkpoint at all.

Figures: the group's steady samples/s (`workloads.steady_state`), ratio ours/baseline
(target >= 0.95 for every 10 steps: checkpoints are off the step's critical path; every
step is reported without a target), and what a checkpoint cost the step that took it
(the state copy, from the first member's log).
"""

from __future__ import annotations

import argparse
import re
import time

import harness
from harness import log, row, write_result

import elasticdl_nb as edl

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)

WORKERS = 3
NEVER = 10**9
COPY_LINE = re.compile(
    r"replica checkpoints taken: (\d+); the state copy on the step: median ([0-9.]+) ms"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat each")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    w = workloads.workloads(quick=args.quick)["digits"]
    started = time.perf_counter()
    runs: dict[str, list[dict]] = {"every 10 steps": [], "every step": [], "never": []}
    with harness.job_home():
        for rep in range(repeats):
            for label, every in (("every 10 steps", 10), ("every step", 1), ("never", NEVER)):
                tag = f"ckpt-{every}-{rep}"
                out = workloads.run_job(
                    w, WORKERS, tag, strategy="allreduce", checkpoint_steps=every
                )
                logs = (edl.attach(out["job"]).dir / "logs").glob("worker-*.log")
                found = [m for p in logs for m in COPY_LINE.findall(p.read_text())]
                out["copy_ms"] = [float(ms) for _, ms in found]
                taken = sum(int(n) for n, _ in found)
                # How far back a loss of every replica goes, at most (the writer keeps to
                # its share of the time: runtime/collective/checkpoints.py).
                out["seconds_between"] = out["wall_s"] / taken if taken else None
                log(
                    f"{label} ({rep + 1}/{repeats}): {out['samples_per_s']:.0f} samples/s; "
                    f"{taken} checkpoints in {out['wall_s']:.1f} s; state copy per "
                    f"checkpoint (median, per first member) {out['copy_ms']} ms"
                )
                runs[label].append(out)
    case = f"digits MLP, allreduce, {WORKERS} workers"
    never = [r["samples_per_s"] for r in runs["never"]]
    rows = [
        row(case, "samples/s, a checkpoint every 10 steps",
            [r["samples_per_s"] for r in runs["every 10 steps"]], never, unit="samples/s",
            baseline_label="no checkpoints", target=0.95),
        row(case, "samples/s, a checkpoint every step (worst case)",
            [r["samples_per_s"] for r in runs["every step"]], never, unit="samples/s",
            baseline_label="no checkpoints"),
        row(case, "state copy on the step, per checkpoint",
            [c for r in runs["every step"] for c in r["copy_ms"]], unit="ms",
            higher_is_better=False, limit=5.0),
        row(case, "job seconds per checkpoint taken, asked every step",
            [r["seconds_between"] for r in runs["every step"] if r["seconds_between"]],
            unit="s", higher_is_better=False),
    ]  # fmt: skip
    write_result(
        "replica_checkpoints",
        "Allreduce replica checkpoints every step vs none: the step's throughput",
        rows,
        {"runs": runs},
        seconds=time.perf_counter() - started,
    )


if __name__ == "__main__":
    main()
