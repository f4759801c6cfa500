"""Elastic scheduling against gang scheduling on the real node (ElasticDL's experiments
A and C).

    .venv/bin/python bench/elastic_scheduling.py [--quick] [--strategies ps allreduce]
        [--reserved-cpu-m M] [--epochs N]

Two jobs whose CPU requests do not fit together on the node, the second submitted
SECOND_AFTER seconds after the first, run twice in one run on the same node, first as
two PS jobs (A), then as two allreduce jobs (C):

- gang: each job asks for a fixed MAX workers, and the second is submitted only when all
  of its pods fit (the node's free CPU holds its master, PS and MAX workers): what a gang
  scheduler (Volcano's gang plugin, kube-batch) does, done here by the benchmark as its
  admission step, since the test node has only the default scheduler;
- elastic: each job asks for the range MIN:MAX and is submitted at once; the second
  starts with what is free and grows when the first ends (an allreduce group forms with
  MIN and takes the others in place as they come; lr_scaling stays 'none', so the
  learning rate is the optimizer's at every group size and the global batch grows
  with the group).

The node is made to behave like a cluster whose pods use what they request: every
container's CPU limit is CPU_LIMIT, a worker's request (a pod template), so a job's speed
follows the CPU the scheduler gave it. The node's allocatable CPU is the machine's 2
cores whole (a cluster node keeps ~5 % for its kubelet; the control plane, here on the
same cores, would run elsewhere); --reserved-cpu-m keeps some from pods, as the other
node benchmarks keep 500m, and writes its result as RESERVED. Requests: master
MASTER_CPU, PS PS_CPU, workers WORKER_CPU each; a job at MAX asks for more than half of
the node (`shape`). What the pods really use is read from the kubelet's summary
API through the API server (usageNanoCores per pod) and reported beside the requests.

Measured, per mode: makespan (the first submission to the last job's end), each job's
time from its submission to its end, the CPU requested by the two jobs over allocatable
(sampled every SAMPLE_S, averaged over the makespan), each job's accuracy on the digits
it did not train on, and that every record was applied exactly once per epoch (the PS
ledger; the replicas' ledgers for allreduce).

What the node allows (node_bench.ideal_pair, quoted beside each row): a job's speed
follows its workers, its master and PS being a fixed cost. Beside a first job at MAX the
second gets its master, PS and the workers that fit in what is left, a share s of its
MAX, so with nothing lost to start-ups gang takes 2T (T: a job alone) and elastic
E = 2T − (T−o)·s (o: SECOND_AFTER). On the whole node s is 3/4 (A) and 4/5 (C): 0.65×
and 0.62× at the T measured, requested 0.87 and 0.89. With 500m reserved, jobs of 900m
leave the second 1 of 3 workers (A, 100m idle) or 2 of 4 (C): 0.85× and 0.78 for A,
so the targets (0.75×, 0.85: ElasticDL's 24-CPU cluster, whose second job started with
11 of 13 CPU) are out of reach there for any schedule.

The gang runs are each job alone on the node, so they are the accuracy baseline. A short
warm-up job runs first (not counted): the first pods on a node read the image's files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)
from node_bench import (  # noqa: E402
    CPU_LIMIT,
    MASTER_CPU,
    PS_CPU,
    RESERVED_CPU_M,
    WORKER_CPU,
    CpuSampler,
    NodeBench,
    ideal_pair,
    skipped,
    usage_by_role,
    usage_share,
    utilization,
)

import elasticdl_nb as edl  # noqa: E402
from elasticdl_nb.runtime.ps.ledger import ledger_problems  # noqa: E402
from elasticdl_nb.runtime.worker.replica_records import replica_problems  # noqa: E402
from tests.kubernetes.node_cpu import free_millicores  # noqa: E402

# Per strategy: (PS, MIN). MAX is the fewest workers that make a job at MAX ask for more
# than half of the node (`shape`): 900m of 1500m (3 workers with a PS, 4 allreduce), 1100m
# of 2000m (4 and 5); like ElasticDL's 13 of 24 CPU, small enough that gang scheduling
# leaves a large share idle, which is what elasticity can use (requests and limits:
# node_bench.py).
SHAPES = {"ps": (1, 1), "allreduce": (0, 2)}
SECOND_AFTER = 30.0
# Where a run on a node with CPU kept from pods goes (--reserved-cpu-m), beside the
# whole node's.
RESERVED = "elastic_scheduling_reserved"
# The second job's epochs over the first's. Allreduce was 1.5 while an epoch had 2 tasks:
# two workers then trained as fast as four, the second job at MIN ended with the first and
# never grew (Workload.with_tasks_for).
SECOND_LONGER = {"ps": 1.0, "allreduce": 1.0}
EPOCHS = {True: 500, False: 2000}  # by --quick; full: a PS job alone ~6.5 min at MAX
WARMUP_EPOCHS = 5
JOBS = ("a", "b")


def shape(strategy: str, allocatable: int) -> tuple[int, int, int]:
    """(PS, MIN, MAX) of a job of `strategy` on a node of `allocatable` millicores."""
    ps, least = SHAPES[strategy]
    fixed = MASTER_CPU + ps * PS_CPU
    return ps, least, (allocatable // 2 - fixed) // WORKER_CPU + 1


def job_cpu(strategy: str, allocatable: int) -> int:
    """Millicores a job of `strategy` requests at MAX."""
    ps, _, most = shape(strategy, allocatable)
    return MASTER_CPU + ps * PS_CPU + most * WORKER_CPU


def workers_beside(strategy: str, allocatable: int) -> int:
    """The second job's workers that fit beside the first at MAX (its master and PS
    placed first, as their priority has them)."""
    ps, _, most = shape(strategy, allocatable)
    free = allocatable - job_cpu(strategy, allocatable) - MASTER_CPU - ps * PS_CPU
    return max(0, min(most, free // WORKER_CPU))


def job_epochs(strategy: str, key: str, epochs: int) -> int:
    """The epochs of job `key` ("a", "b") of `strategy` (SECOND_LONGER)."""
    return round(epochs * SECOND_LONGER[strategy]) if key == JOBS[1] else epochs


def worker_starts(events: list, t0: float) -> dict[int, dict[str, float | None]]:
    """Each worker's pod made (`started`), confirmed running (`running`) and first asking
    for work (`asked`: TensorFlow imported, the model built), in seconds since t0, from
    the job's journal: how long growing into freed room takes."""
    out: dict[int, dict[str, float | None]] = {}
    for e in events:
        d = e.data
        if e.kind == "instance" and d["role"] == "worker" and d["kind"] in ("started", "running"):
            out.setdefault(d["id"], {"started": None, "running": None, "asked": None})
            out[d["id"]][d["kind"]] = out[d["id"]][d["kind"]] or round(e.time - t0, 1)
        elif e.kind == "queue" and d["op"] == "next_for" and d.get("worker_id") in out:
            times = out[d["worker_id"]]  # (next_for's argument, as the queue journals it)
            times["asked"] = times["asked"] or round(e.time - t0, 1)
    return out


def run_mode(mode, strategy, w, epochs, options, bench: NodeBench) -> dict[str, Any]:
    """Both jobs in one mode; returns their figures and the CPU samples."""
    core, node, allocatable = bench.core, bench.node, bench.allocatable
    sampler = CpuSampler(core, options["namespace"], node).start()
    ps, least, most = shape(strategy, allocatable)
    workers = f"{least}:{most}" if mode == "elastic" else most
    kind = {"strategy": strategy, **({"ps": ps} if ps else {})}
    jobs: dict[str, edl.Job] = {}
    submitted: dict[str, float] = {}
    t0 = time.time()
    try:
        for i, key in enumerate(JOBS):
            if i:
                time.sleep(max(0.0, t0 + SECOND_AFTER - time.time()))
                if mode == "gang":  # admission: all of its pods must fit
                    while free_millicores(core, node) < job_cpu(strategy, allocatable):
                        time.sleep(0.5)
            submitted[key] = time.time()
            name = f"{key}-{mode}-{strategy}"
            jobs[key] = w.train(workers=workers, epochs=job_epochs(strategy, key, epochs),
                                name=name, **kind, **options)  # fmt: skip
            harness.log(f"{name}: submitted at {submitted[key] - t0:.1f} s")
        ends = {}
        for key, job in jobs.items():
            status = job.wait(timeout=w.timeout * 6, progress=False)
            ends[key] = status.get("ended") or time.time()
            harness.log(f"{job.name}: {status['state']} at {ends[key] - t0:.1f} s")
            assert status["state"] == "succeeded", status
    finally:
        sampler.stop()
    held_out = workloads.digits_data(1797)
    x, y = held_out[0][w.records :], held_out[1][w.records :]
    out = {"t0": t0, "makespan_s": max(ends.values()) - t0, "jobs": {}}
    for key, job in jobs.items():
        events = list(job.events(follow=False))
        trained = job_epochs(strategy, key, epochs)
        model = job.model()
        predicted = model.predict(x, verbose=0).argmax(axis=1)
        out["jobs"][key] = {
            "name": job.name,
            "submitted_s": submitted[key] - t0,
            "ended_s": ends[key] - t0,
            "completion_s": ends[key] - submitted[key],
            "accuracy": float((predicted == y).mean()),
            # (allreduce) each group version's size and when it formed: growth in place
            "group_sizes": [
                [round(e.time - t0, 1), len(e.data["members"])] for e in events if e.kind == "group"
            ],
            "worker_starts": worker_starts(events, t0),
            "ledger_problems": (
                ledger_problems(job.dir, 1, [w.records], trained)
                if ps
                else replica_problems(job.dir, [w.records], w.batch, trained)
            )[:5],
        }
    out["samples"] = sampler.samples
    out["usage_error"] = sampler.usage_error
    return out


def build_rows(strategy: str, runs: dict[str, dict], allocatable: int, epochs: int) -> list[dict]:
    e, g = runs["elastic"], runs["gang"]
    _, least, most = shape(strategy, allocatable)
    longer = SECOND_LONGER[strategy]
    cpu = job_cpu(strategy, allocatable)
    case = (
        f"2 {strategy} jobs (CNN digits, {epochs} epochs) of {cpu}m at MAX on a "
        f"{allocatable}m node, the 2nd {SECOND_AFTER:.0f} s later, workers "
        f"{least}:{most} vs {most}" + (f", the 2nd {longer:g}× as long" if longer != 1 else "")
    )
    a_end, b = e["jobs"]["a"]["ended_s"], e["jobs"]["b"]
    sizes = [f"{n} at {t:.0f} s" for t, n in b.get("group_sizes", [])]
    grown = [
        f"worker {w}: pod made at {t['started']:.0f} s, "
        f"asked for work {t['asked'] - t['started']:.0f} s later"
        for w, t in (b.get("worker_starts") or {}).items()
        if t["started"] is not None and t["started"] > a_end and t["asked"] is not None
    ]
    beside = workers_beside(strategy, allocatable)
    bound = ideal_pair(
        g["jobs"]["a"]["completion_s"], SECOND_AFTER, beside / most, cpu,
        cpu - (most - beside) * WORKER_CPU, allocatable, longer,
    )  # fmt: skip
    best = f"the ideal with {beside} of {most} workers beside the 1st (ideal_pair):"
    growth = "; ".join(
        [f"the 1st ended at {a_end:.0f} s"]
        + ([f"the 2nd's group: {', '.join(sizes)}"] if sizes else [])
        + grown
    )
    rows = [
        harness.row(case, "makespan", [e["makespan_s"]], [g["makespan_s"]], unit="s",
                    baseline_label="gang scheduling", higher_is_better=False,
                    target=1 / 0.75,
                    note=f"target: elastic ≤ 0.75× gang; {best} {bound['ratio']:.2f}×"),
        harness.row(case, "CPU requested / allocatable over the makespan",
                    [utilization(e, allocatable)], [utilization(g, allocatable)],
                    baseline_label="gang scheduling", limit=0.85,
                    note=f"ElasticDL's experiment: ≈ 0.73 elastic, ≈ 0.51 gang; elastic "
                         f"{best} {bound['requested']:.2f}"),
        harness.row(case, "2nd job, submitted to done", [e["jobs"]["b"]["completion_s"]],
                    [g["jobs"]["b"]["completion_s"]], unit="s",
                    baseline_label="gang scheduling", higher_is_better=False,
                    note=growth),
    ]  # fmt: skip
    for key in JOBS:
        gap = abs(e["jobs"][key]["accuracy"] - g["jobs"][key]["accuracy"])
        rows.append(
            harness.row(case, f"job {key}: |accuracy elastic − alone|", [gap],
                        higher_is_better=False, limit=0.01,
                        note=f"elastic {e['jobs'][key]['accuracy']:.4f}, "
                             f"alone (gang) {g['jobs'][key]['accuracy']:.4f}")
        )  # fmt: skip
    problems = sum(len(r["jobs"][k]["ledger_problems"]) for r in runs.values() for k in JOBS)
    ledger = "PS ledger" if strategy == "ps" else "replica ledger"
    rows.append(
        harness.row(case, f"{ledger} problems, all 4 jobs", [problems],
                    higher_is_better=False, limit=0, note="each record once per epoch")
    )  # fmt: skip
    return rows


def carried_over(previous: dict, ran: list[str]) -> tuple[list[dict], dict, dict]:
    """The rows, runs and run facts (node, command) of the strategies this run did not
    measure, from the previous result: `--strategies allreduce` keeps A's figures, each
    with the node and command it was measured with, so that the one result file and
    picture hold both experiments."""
    if not previous:
        return [], {}, {}
    details = previous.get("details", {})
    runs = details.get("runs", {})
    if "gang" in runs:  # (a result from before C: the PS runs only)
        runs = {"ps": runs}
    facts = details.get("by_strategy") or {
        "ps": {"allocatable_m": details.get("allocatable_m"), "command": previous["command"]}
    }
    kept = [k for k in runs if k not in ran]
    rows = [r for r in previous.get("rows", []) for k in kept
            if r["case"].lower().startswith(f"2 {k} jobs")]  # fmt: skip
    return rows, {k: runs[k] for k in kept}, {k: facts[k] for k in kept if k in facts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs")
    parser.add_argument(
        "--strategies", nargs="+", choices=list(SHAPES), default=list(SHAPES),
        help="A (ps), C (allreduce), or both",
    )  # fmt: skip
    parser.add_argument(
        "--reserved-cpu-m", type=int, default=0,
        help="CPU kept from pods (allocatable: 2000m less this; the other node benchmarks "
             f"keep {RESERVED_CPU_M}m); a result with any is written as {RESERVED}",
    )  # fmt: skip
    parser.add_argument("--epochs", type=int, help="a job's epochs (default: by --quick)")
    args = parser.parse_args()
    command = " ".join([".venv/bin/python bench/elastic_scheduling.py", *sys.argv[1:]])
    name = RESERVED if args.reserved_cpu_m else "elastic_scheduling"
    title = "Elastic vs gang scheduling: two jobs that do not fit together on the real node"
    t_start = time.perf_counter()
    if skipped(name, title, command):
        return 0
    epochs = args.epochs or EPOCHS[args.quick]
    runs: dict[str, dict] = {}
    with NodeBench("elastic", args.reserved_cpu_m) as bench, harness.job_home():
        most = max(shape(k, bench.allocatable)[2] for k in args.strategies)
        w = workloads.workloads(args.quick)["cnn"].with_tasks_for(most)
        # Not counted: the node's first pods read the image's files, this process's
        # first train() traces the check step.
        _, options = bench.run_options()
        warm = w.train(workers=4, ps=1, epochs=WARMUP_EPOCHS, name="warm-up", **options)
        bench.details["warmup"] = warm.wait(timeout=w.timeout * 2, progress=False)["state"]
        for strategy in args.strategies:
            runs[strategy] = {}
            for mode in ("gang", "elastic"):
                _, options = bench.run_options()
                run = run_mode(mode, strategy, w, epochs, options, bench)
                run["usage_over_requests"] = usage_share(run)
                run["usage_by_role_m"] = usage_by_role(run)
                runs[strategy][mode] = run
    rows = [r for k, v in runs.items() for r in build_rows(k, v, bench.allocatable, epochs)]
    previous = harness.RESULTS_DIR / f"{name}.json"
    kept_rows, kept_runs, kept_facts = carried_over(
        json.loads(previous.read_text()) if previous.exists() else {}, args.strategies
    )
    by_strategy = {
        k: {"allocatable_m": bench.allocatable, "command": command, "epochs": epochs} for k in runs
    }
    details = dict(
        bench.details,
        runs={**kept_runs, **runs},
        by_strategy={**kept_facts, **by_strategy},
        allocatable_m=bench.allocatable,
        requests={"master": MASTER_CPU, "ps": PS_CPU, "worker": WORKER_CPU},
        cpu_limit_m=CPU_LIMIT,
        shapes={k: dict(zip(("ps", "min", "max"), shape(k, bench.allocatable))) for k in SHAPES},
        second_after_s=SECOND_AFTER,
        model=w.title,
        epochs=epochs,
        records=w.records,
    )
    harness.write_result(
        name, title, kept_rows + rows, details, command=command,
        seconds=time.perf_counter() - t_start,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
