"""`make bench`: every benchmark, one after another, then the merged results, plots, table.

    .venv/bin/python bench/run.py [--quick] [--only throughput,transfer,...]
    .venv/bin/python bench/run.py --merge --only elastic_service,...


Each benchmark runs as its own process (a fresh TensorFlow, no state carried between
them) and writes bench/results/<name>.json (bench/harness.py). This script then writes
bench/results.json (all of them, with the machine and the code measured, each one's
details left in its own file; with --only, the other benchmarks' latest results are
kept), the PNG plots
(bench/plots.py) and the results table between the markers in bench/README.md, and prints
every ratio. A benchmark that fails is reported as failed; the others still run, and the
exit status says so. A benchmark that cannot run on this machine (kubernetes_node.py without
root or without the real node's programs) writes a result that says why, shown as
skipped; that is no failure. `--merge` runs nothing: it takes the named benchmarks'
result files as their own runs left them (e.g. `bench/elastic_service.py --quick`) into
bench/results.json, the plots and the table; a row from a quick run says so.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

import harness
import plots

# In the order of issue 3's list; the profile is last (it reads no other result).
BENCHMARKS = [
    "throughput",
    "tf_ps_strategy",
    "transfer",
    "recovery",
    "allreduce_recovery",
    "chaos",
    "replica_checkpoints",
    "embeddings",
    "startup",
    "event_path",
    "widget_path",
    "scaling",
    "kubernetes_node",
    "node_loss",
    "elastic_scheduling",
    "elastic_service",
    "elastic_growth",
    "tls_cost",
    "long_journal",
    "ctr_journal",
    "many_workers",
    "profile_step",
]
# Results a benchmark writes when run with other options than `make bench` gives it, kept
# beside the others (each says its command): elastic_scheduling --reserved-cpu-m 500.
VARIANTS = ["elastic_scheduling_reserved"]
README = harness.ROOT / "bench" / "README.md"
TABLE_BEGIN = "<!-- results table: written by bench/run.py -->"
TABLE_END = "<!-- end of results table -->"


def _cell(stats: dict | None, unit: str) -> str:
    if not stats or stats["median"] is None:
        return "—"

    def fmt(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    spread = f" ({fmt(stats['min'])}–{fmt(stats['max'])}, n={stats['n']})" if stats["n"] > 1 else ""
    return f"{fmt(stats['median'])} {unit}".strip() + spread


def _verdict(r: dict) -> str:
    if r["target"] is not None:
        return f"≥ {r['target']:.3g}: {'met' if r['met'] else '**not met**'}"
    if r["limit"] is not None:
        bound = "≥" if r["higher_is_better"] else "≤"
        return f"{bound} {r['limit']}: {'met' if r['met'] else '**not met**'}"
    return ""


def table(results: dict) -> str:
    lines = [
        "| benchmark | case | metric | ours | baseline | ratio | target |",
        "|---|---|---|---|---|---:|---|",
    ]
    for name, doc in results.items():
        if "error" in doc:
            lines.append(f"| {name} | — | — | failed: {doc['error'][:120]} | | | |")
            continue
        if skipped := doc.get("details", {}).get("skipped"):
            lines.append(f"| {name} | — | — | skipped: {skipped[:200]} | | | |")
            continue
        when = f"{name}<br>{doc['machine']['date'][:16].replace('T', ' ')}"
        if "--quick" in doc.get("command", ""):
            when += "<br>(--quick)"
        for r in doc["rows"]:
            base = _cell(r["baseline"], r["unit"])
            if r["baseline"]:
                base = f"{r['baseline_label']}: {base}"
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
            lines.append(
                f"| {when} | {r['case']} | {r['metric']} | {_cell(r['ours'], r['unit'])} "
                f"| {base} | {ratio} | {_verdict(r)} |"
            )
    return "\n".join(lines)


def write_readme_table(results: dict, machine: dict, command: str) -> None:
    text = README.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise SystemExit(f"{README} lacks the results-table markers")
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    body = (
        f"\nLatest run of each benchmark (here: `{command}`, {machine['date']}, code "
        f"{machine['code']}; {machine['cores']} cores, {machine['cpu']}; each benchmark's "
        "date, code, load and every run are in bench/results.json). Ratio: how many times "
        "better than the baseline (ours/baseline for rates, baseline/ours for times); "
        "median (min–max, n runs).\n\n" + table(results) + "\n"
    )
    README.write_text(head + TABLE_BEGIN + body + TABLE_END + tail)


def publish(results: dict[str, dict], run: dict | None = None) -> list:
    """`results` into bench/results.json beside the other benchmarks' latest (each entry
    carries its own date, machine and code state), then the plots and the table. `run`:
    this run's command, seconds and machine; None keeps the file's (the last full run)."""
    merged_path = harness.ROOT / "bench" / "results.json"
    previous = json.loads(merged_path.read_text()) if merged_path.exists() else {}
    everything = {**_latest(previous.get("results", {})), **results}
    everything = {n: everything[n] for n in BENCHMARKS + VARIANTS if n in everything}
    head = run or {k: previous[k] for k in ("command", "seconds", "machine")}
    # Each benchmark's details (every run, every sample) stay in its own result file,
    # which is tracked too: copied here they made this file megabytes of duplicates.
    merged = {**head, "results": {n: _without_details(n, doc) for n, doc in everything.items()}}
    merged_path.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    written = plots.draw(everything, harness.ROOT / "bench" / "plots")
    write_readme_table(everything, head["machine"], head["command"])
    return written


def _latest(previous: dict[str, dict]) -> dict[str, dict]:
    """The benchmarks in results.json, whole: from their own result files where those
    are (the plots read the details), else as results.json has them."""
    whole = {}
    for name, doc in previous.items():
        own = harness.RESULTS_DIR / f"{name}.json"
        whole[name] = json.loads(own.read_text()) if own.exists() else doc
    return whole


def _without_details(name: str, doc: dict) -> dict:
    if "details" not in doc:
        return doc
    where = (harness.RESULTS_DIR / f"{name}.json").relative_to(harness.ROOT)
    return {**{k: v for k, v in doc.items() if k != "details"}, "details_in": str(where)}


def merge(names: list[str]) -> int:
    """The named benchmarks' result files, as their own runs left them, published."""
    publish({n: json.loads((harness.RESULTS_DIR / f"{n}.json").read_text()) for n in names})
    harness.log(f"merged {', '.join(names)} into bench/results.json and the table")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick mode")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated")
    parser.add_argument(
        "--extra", default="", help="arguments for each benchmark run (e.g. '--parts B,C')"
    )
    parser.add_argument(
        "--merge", action="store_true",
        help="run nothing: merge the --only benchmarks' result files as they are",
    )  # fmt: skip
    args = parser.parse_args()
    if args.merge:
        return merge(args.only.split(","))
    command = " ".join(
        ["make bench" if len(sys.argv) == 1 else ".venv/bin/python bench/run.py", *sys.argv[1:]]
    )
    machine = harness.machine()
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    for name in args.only.split(","):
        harness.log(f"=== {name}")
        started = time.perf_counter()
        argv = [harness.PY, str(harness.ROOT / "bench" / f"{name}.py")]
        if args.quick:
            argv.append("--quick")
        argv += shlex.split(args.extra)
        done = subprocess.run(argv, cwd=harness.ROOT)
        path = harness.RESULTS_DIR / f"{name}.json"
        if (
            done.returncode == 0
            and path.exists()
            and path.stat().st_mtime >= time.time() - (time.perf_counter() - started) - 1
        ):
            results[name] = json.loads(path.read_text())
        else:
            results[name] = {"error": f"exit status {done.returncode}"}
        harness.log(f"=== {name}: {time.perf_counter() - started:.0f} s")
    seconds = time.perf_counter() - t0
    # A partial run (--only) replaces its benchmarks' entries and keeps the others.
    written = publish(results, {"command": command, "seconds": seconds, "machine": machine})
    print()
    for name, doc in results.items():
        for r in doc.get("rows", []):
            print(f"{name}: {harness.describe(r)}")
        if "error" in doc:
            print(f"{name}: FAILED ({doc['error']})")
        if skipped := doc.get("details", {}).get("skipped"):
            print(f"{name}: SKIPPED ({skipped})")
    harness.log(
        f"all benchmarks: {seconds / 60:.1f} min; wrote bench/results.json, "
        f"{len(written)} plots under bench/plots/, the table in bench/README.md"
    )
    return 1 if any("error" in doc for doc in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
