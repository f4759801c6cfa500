"""Many workers, by simulation: a real master and a real PS under 10 to 1,000 workers.

    .venv/bin/python bench/many_workers.py            # 10 ... 1000 workers (~13 min)
    .venv/bin/python bench/many_workers.py --quick    # 10 ... 300, shorter windows (~5 min)

The job (simulated_job.py): a PS job of the digits MLP (64-64-10, Adam, ~19 KB of
parameters; synthetic_digits.py, a model-zoo module whose `custom_data_reader` describes
its records instead of staging them: 100,000 tasks an epoch, or 1,000 in the "epoch
ends" ladder), one PS, minibatches of 64, tasks of 8 minibatches (the defaults),
prepared as `edl.train` prepares a job. Its master is the real master process (the
runtime's `serve` with a local job's site) and its PS the real PS process; only the
master's launcher is the benchmark's: it starts the PS as a local job does and reports
each worker launched as started, since a load generator runs it.

The workers (simulated_workers.py): `--generators` processes (2), each an asyncio loop
driving its share, each worker with its own gRPC connection to the master and its own TCP
connection to the PS's bulk channel, at a real worker's rates: a numbered GetTask per
task, one push+pull per minibatch then `--step-ms` (100) of computation, a report every
0.2 s and at each task's end, a heartbeat after 5 s of silence. A real digits-MLP step
on this machine is ~3 ms (bench/results/throughput.json: 20.8k samples/s at 64 per step,
1 worker + 1 PS): 100 ms stands for a bigger model or a slower worker, and the load at
another pace is the load of proportionally more or fewer workers.

Three ladders, each one job grown by the master's own Scale RPC through the sizes:
- "with the PS": the whole job on this machine;
- "master alone": the workers skip the PS (as if it had shards to spare: a 1,000-worker
  job has many PS), so that nothing but the master holds them back;
- "epoch ends": with the PS, from 300 workers on, with epochs of 1,000 tasks, so that
  every window holds an epoch's end (the other two never reach one), where every worker
  finishes its last task and long-polls GetTask until the next epoch begins.
At each size, after a warm-up, a window of `PARTS` parts (rates: median and range over
the parts; latencies: p50/p99 over the window): task hand-outs/s, reports/s, pushes/s;
GetTask answered with a task, ProgressReport, push+pull latencies; RPC errors (each one
retried; the master's "busy" apart); whether the master said it was saturated
(`master_saturated` / `master_caught_up`); the master's and the PS's CPU (% of one
core), RSS, threads and sockets (the PS: one per bulk connection); journal events/s
(by their numbers) and the events that say
something went wrong (relaunches, instance ends, workers given up on, requeues,
stragglers); each generator's CPU and its loop's lag (how late a 50 ms sleep wakes).
Then (not with --quick) 5 s of py-spy on the master and the PS, summarized into where
their threads were.

Is the generator the limit? Its CPU and loop lag are in the table; and the first
master-alone size that falls behind the workers' pace is run again in two fresh jobs, with
`--generators` and twice as many: if the generators held the figures down there, more of
them would raise them.

Rows: per ladder and size, pushes/s against the workers' own pace (N / step: the ratio
is the share of their pace the job keeps) and the p99 of ProgressReport; per ladder, the
errors and trouble events (limit 0); the generator check.
`bench/results/many_workers.md`: the whole table, the knees and the profiles.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness import PY, RESULTS_DIR, job_home, log, pin_threads, row, write_result
from simulated_job import (
    MINIBATCH,
    PER_TASK,
    Job,
    ProcessSample,
    cpu_percent,
    prepare_job,
    running_job,
)
from simulated_workers import Histogram

from elasticdl_nb.runtime.master.journal import read_journal_file
from elasticdl_nb.vocabulary import EventKind

NAME = "many_workers"
SIZES, QUICK_SIZES = (10, 30, 100, 300, 1000), (10, 30, 100, 300)
PARTS = 4  # parts of a size's window: rates are their median and range
KEPT = 0.9  # the knee: the largest size whose workers keep this share of their pace
WATCHED = (  # journal events that say something went wrong, counted per window
    EventKind.RELAUNCH,
    EventKind.RELAUNCH_REFUSED,
    EventKind.PEER_UNREACHABLE,
    EventKind.REQUEUE,
    EventKind.STRAGGLER,
)
SATURATION_KINDS = (EventKind.MASTER_SATURATED, EventKind.MASTER_CAUGHT_UP)
BUSY = "RESOURCE_EXHAUSTED"  # a call the master turned away (saturation.py): retried


@dataclass(frozen=True)
class Ladder:
    """One job grown through the sizes (from `smallest` on)."""

    exchange: bool  # its workers exchange with the PS
    epoch_tasks: int
    smallest: int = 0


# Long epochs: more tasks than a ladder hands out, so that no epoch ends (and without the
# PS exchange, none may: the PS would hold none of the epoch's minibatches at its end, so
# the master would queue them all again). Short ones: an epoch's end in every window,
# where every worker waits for the last tasks of the epoch (and long-polls GetTask).
LONG, SHORT = 100_000, 1_000
LADDERS = {
    "with the PS": Ladder(exchange=True, epoch_tasks=LONG),
    "master alone": Ladder(exchange=False, epoch_tasks=LONG),
    "epoch ends": Ladder(exchange=True, epoch_tasks=SHORT, smallest=300),
}


# ---------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Settings:
    step_s: float
    warmup_s: float
    part_s: float
    profile_s: float  # 0: no profile


def newest_seq(path: Path) -> int:
    """The number of the newest whole event in the journal file (-1: none yet)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 65536))
        data = f.read()
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return json.loads(lines[-1])["seq"] if lines else -1


def journal_since(path: Path, seq: int) -> list[dict]:
    """The events from number `seq` on, as the journal keeps them (the master compacts
    its journal every 20,000 events: an event of a dropped or thinned kind before a cut
    may be gone; the count of events written is the numbers', `newest_seq`)."""
    return [{"seq": e.seq, "kind": e.kind, "data": e.data} for e in read_journal_file(path, seq)]


def saturation(events: list[dict], busy_before: bool) -> dict[str, Any]:
    """The master's saturation in a window: the spells begun and ended, the calls turned
    away in spells that ended, and whether it was behind at the window's end."""
    spells = [e for e in events if e["kind"] in SATURATION_KINDS]
    busy = spells[-1]["kind"] == EventKind.MASTER_SATURATED if spells else busy_before
    return {
        "began": sum(e["kind"] == EventKind.MASTER_SATURATED for e in spells),
        "ended": sum(e["kind"] == EventKind.MASTER_CAUGHT_UP for e in spells),
        "behind_at_end": busy,
        "first": next((e["data"] for e in spells if e["kind"] == EventKind.MASTER_SATURATED), None),
    }


def measure(job: Job, workers: int, s: Settings) -> dict[str, Any]:
    """One window at the job's current size (see the module docstring)."""
    time.sleep(s.warmup_s)
    job.mark()  # (the warm-up's figures go)
    ps_pid = job.ps_pid()
    pids = {"master": job.master_pid, "ps": ps_pid} | {
        f"generator-{i}": g.proc.pid for i, g in enumerate(job.generators)
    }
    looks = [{name: ProcessSample.of(pid) for name, pid in pids.items()}]
    first_seq = newest_seq(job.record.files.events) + 1
    began = time.monotonic()
    parts = []
    for _ in range(PARTS):
        time.sleep(s.part_s)
        marks = job.mark()
        looks.append({name: ProcessSample.of(pid) for name, pid in pids.items()})
        parts.append(_part(marks, looks[-2], looks[-1]))
    seconds = time.monotonic() - began
    events = journal_since(job.record.files.events, first_seq)
    written = newest_seq(job.record.files.events) + 1 - first_seq
    latency: dict[str, Histogram] = collections.defaultdict(Histogram)
    for part in parts:
        for kind, hist in part.pop("latency").items():
            latency[kind].merge(hist)
    kinds = collections.Counter(e["kind"] for e in events)
    ended = sum(
        e["kind"] == EventKind.INSTANCE and e["data"].get("kind") in ("killed", "failed")
        for e in events
    )
    first, last = looks[0], looks[-1]
    result = {
        "workers": workers,
        "seconds": seconds,
        "parts": parts,
        "latency_ms": {
            kind: {
                "p50": _ms(h.percentile(50)),
                "p99": _ms(h.percentile(99)),
                "max": _ms(h.percentile(100)),
                "n": h.count,
            }
            for kind, h in sorted(latency.items())
        },
        "events_per_s": written / seconds,
        "saturation": saturation(events, job.behind),
        "epochs_begun": kinds.get(EventKind.EPOCH, 0),
        "event_kinds": dict(kinds.most_common()),
        "trouble": {str(k): kinds.get(k, 0) for k in WATCHED} | {"instance_ended": ended},
        "processes": {name: _process(first[name], last[name]) for name in pids},
        "master_alive": job.master_proc.poll() is None,
    }
    job.behind = result["saturation"]["behind_at_end"]
    if s.profile_s:
        result["profile"] = profile({"master": job.master_pid, "ps": ps_pid}, s.profile_s)
    return result


def _process(first: ProcessSample | None, last: ProcessSample | None) -> dict[str, Any]:
    if last is None:
        return {"cpu_percent": None, "exited": True}
    return {
        "cpu_percent": cpu_percent(first, last),
        "rss_mb": round(last.rss_mb, 1),
        "rss_mb_before": round(first.rss_mb, 1) if first else None,
        "threads": last.threads,
        "sockets": last.sockets,
    }


def _part(marks: list[dict], before: dict, after: dict) -> dict[str, Any]:
    """One part of a window: the generators' counts as rates, their latencies merged."""
    seconds = max(m["seconds"] for m in marks)
    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    latency: dict[str, Histogram] = collections.defaultdict(Histogram)
    for m in marks:
        counts.update(m["counts"])
        errors.update(m["errors"])
        for kind, buckets in m["latency"].items():
            latency[kind].merge(Histogram.from_json(buckets))
    lag = latency.pop("loop_lag", Histogram())
    return {
        "seconds": seconds,
        "rates": {k: v / seconds for k, v in sorted(counts.items())},
        "errors": dict(errors),
        "cpu_percent": {name: cpu_percent(before[name], after[name]) for name in before},
        "loop_lag_p99_ms": _ms(lag.percentile(99)),
        "latency": latency,
        "p99_ms": {kind: _ms(h.percentile(99)) for kind, h in latency.items()},
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


def profile(pids: dict[str, int | None], seconds: float) -> dict[str, Any]:
    """`seconds` of py-spy (100 Hz, without pausing the process) on each process, run side
    by side: where the thread that holds the GIL is (`cpu`: the process's Python work, a
    function's share on the stack and where sampled), and, for the master, where every
    thread is, waiting or not (`threads`: the lines they were at)."""
    pyspy = Path(PY).with_name("py-spy")
    if not pyspy.exists():
        return {"skipped": "py-spy is not installed"}
    runs = {}
    for name, pid in pids.items():
        views = {"cpu": "--gil", "threads": "--idle"} if name == "master" else {"cpu": "--gil"}
        for view, flag in views.items() if pid is not None else ():
            out = RESULTS_DIR / f"{NAME}-{name}-{view}.raw"
            command = [
                str(pyspy),
                "record",
                "-p",
                str(pid),
                "-d",
                str(int(seconds)),
                "-r",
                "100",
                "--nonblocking",
                flag,
                "--format",
                "raw",
                "-o",
                str(out),
            ]
            runs[name, view] = (
                out,
                subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                ),
            )
    summaries: dict[str, Any] = collections.defaultdict(dict)
    for (name, view), (out, proc) in runs.items():
        _, err = proc.communicate(timeout=seconds + 60)
        if proc.returncode or not out.exists():
            summaries[name][view] = {"error": err.strip()[-300:]}
            continue
        summaries[name][view] = summarize_stacks(out.read_text(), lines=view == "threads")
        out.unlink()
    return dict(summaries)


# Frames at the bottom of every thread's stack: on the stack always, saying nothing.
_EVERY_THREAD = {
    "threading.Thread._bootstrap",
    "threading.Thread._bootstrap_inner",
    "threading.Thread.run",
}


def summarize_stacks(raw: str, lines: bool = False, top: int = 12) -> dict[str, Any]:
    """py-spy's raw stacks ('frame;frame;... count' a line) as shares of the samples:
    each function's anywhere on the stack, and where the sample was taken (with `lines`,
    the line: where a thread waits)."""
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f and not f.startswith("thread")]
        if not frames:
            continue
        total += int(count)
        for function in {_function(f) for f in frames} - _EVERY_THREAD:
            inclusive[function] += int(count)
        leaf[_function(frames[-1], lines)] += int(count)

    def shares(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(n / total, 3)) for f, n in counter.most_common(top)]

    return {"samples": total, "inclusive": shares(inclusive), "self": shares(leaf)}


def _function(frame: str, line: bool = False) -> str:
    """'get_task (elasticdl_nb/runtime/master/task_desk.py:71)' -> 'task_desk.get_task'
    (with `line`: 'task_desk.get_task:71')."""
    name, _, where = frame.partition(" (")
    path, _, number = where.rstrip(")").rpartition(":")
    module = Path(path).stem
    qualified = f"{module}.{name}" if module else name
    return f"{qualified}:{number}" if line else qualified


# ---------------------------------------------------------------------------- the runs


def run_ladder(name: str, sizes: tuple[int, ...], s: Settings, generators: int) -> list[dict]:
    """One job grown through `sizes`, a window at each."""
    ladder = LADDERS[name]
    sizes = tuple(n for n in sizes if n >= ladder.smallest) or sizes[-1:]
    record = prepare_job(sizes[0], MINIBATCH * PER_TASK * ladder.epoch_tasks)
    log(f"{name}: job {record.name}, {ladder.epoch_tasks:,} tasks an epoch, {generators} gens")
    results = []
    with running_job(record, _setup_for(s, ladder.exchange), generators) as job:
        for workers in sizes:
            job.grow_to(workers)
            results.append(measure(job, workers, s))
            log(_line(results[-1], s.step_s))
            if not results[-1]["master_alive"]:
                log("the master has exited: this ladder stops here")
                break
    return results


def run_check(workers: int, s: Settings, generators: int) -> dict[str, Any]:
    """A fresh master-alone job of `workers` workers on `generators` generators."""
    record = prepare_job(workers, MINIBATCH * PER_TASK * LONG)
    with running_job(record, _setup_for(s, exchange=False), generators) as job:
        job.grow_to(workers)
        result = measure(job, workers, s)
    log(f"{generators} generators: {_line(result, s.step_s)}")
    return result


def _setup_for(s: Settings, exchange: bool):
    """The generators' `simulated_workers.Setup`, given the model's variables."""
    return lambda variables: {
        "step_seconds": s.step_s,
        "variables": variables,
        "exchange": exchange,
    }


def _rate(result: dict, count: str) -> list[float]:
    return [p["rates"].get(count, 0.0) for p in result["parts"]]


def _pace(workers: int, step_s: float) -> tuple[float, float]:
    """Hand-outs/s and pushes/s of `workers` workers at their own pace."""
    return workers / (PER_TASK * step_s), workers / step_s


def _line(r: dict, step_s: float) -> str:
    """One size's result, for the log."""
    tasks, pushes = (statistics.median(_rate(r, c)) for c in ("tasks", "pushes"))
    pace_tasks, pace_pushes = _pace(r["workers"], step_s)
    lat, procs = r["latency_ms"], r["processes"]
    cpu = {name: f"{procs[name]['cpu_percent'] or 0:.0f}%" for name in ("master", "ps")}
    trouble = {k: v for k, v in r["trouble"].items() if v}
    return (
        f"{r['workers']} workers: {tasks:.0f} hand-outs/s ({tasks / pace_tasks:.2f} of pace), "
        f"{pushes:.0f} pushes/s ({pushes / pace_pushes:.2f}), "
        f"{statistics.median(_rate(r, 'reports')):.0f} reports/s; p99 report "
        f"{lat.get('report', {}).get('p99')} ms, push+pull {lat.get('exchange', {}).get('p99')}"
        f" ms; master {cpu['master']} CPU {procs['master'].get('rss_mb')} MB, PS {cpu['ps']}; "
        f"{r['events_per_s']:.0f} events/s; trouble {trouble or 0}"
    )


def knee(results: list[dict], step_s: float) -> dict[str, Any]:
    """The largest size whose workers keep `KEPT` of their own pace of pushes (one per
    minibatch: the finest measure of it), and the first size that does not."""
    kept = [statistics.median(_rate(r, "pushes")) / _pace(r["workers"], step_s)[1] for r in results]
    below = next((i for i, k in enumerate(kept) if k < KEPT), None)
    at = len(results) - 1 if below is None else below - 1
    return {
        "share_of_pace": [round(k, 3) for k in kept],
        "knee_workers": results[at]["workers"] if at >= 0 else None,
        "first_below": results[below]["workers"] if below is not None else None,
    }


# ---------------------------------------------------------------------------- the report


def result_rows(ladders: dict[str, list[dict]], checks: dict[int, dict], step_s: float) -> list:
    """Per ladder and size, pushes/s (one per minibatch) against the workers' own pace and
    the p99 of ProgressReport; per ladder, its errors and trouble events; the generator
    check. (Hand-outs/s, reports/s and the rest: the details and the .md summary.)"""
    rows = []
    for ladder, results in ladders.items():
        for r in results:
            case = f"{r['workers']} simulated workers, {ladder}"
            rows += [
                row(
                    case,
                    "pushes/s",
                    _rate(r, "pushes"),
                    [_pace(r["workers"], step_s)[1]],
                    baseline_label="the workers' own pace",
                ),
                row(
                    case,
                    "p99 ProgressReport",
                    _p99s(r, "report"),
                    unit="ms",
                    higher_is_better=False,
                ),
            ]
        errors, busy = (sum(_errors(r)[i] for r in results) for i in (0, 1))
        trouble = sum(sum(r["trouble"].values()) for r in results)
        case = f"{ladder}, every size"
        rows += [
            row(
                case,
                "RPC errors but 'busy' (each retried)",
                [errors],
                higher_is_better=False,
                limit=0,
            ),
            row(case, "calls the master turned away busy (retried)", [busy]),
            row(
                case,
                "relaunches, ends, workers given up on, requeues, stragglers",
                [trouble],
                higher_is_better=False,
                limit=0,
            ),
        ]
    if len(checks) == 2:
        (g1, r1), (g2, r2) = sorted(checks.items())
        rows.append(
            row(
                f"{r1['workers']} workers, master alone, fresh jobs: {g2} load generators",
                "pushes/s",
                _rate(r2, "pushes"),
                _rate(r1, "pushes"),
                baseline_label=f"{g1} generators",
            )
        )
    return rows


def _errors(r: dict) -> tuple[int, int]:
    """A size's failed calls (each retried): (those but 'busy', the master's 'busy')."""
    counts = collections.Counter()
    for p in r["parts"]:
        for kind, n in p["errors"].items():
            counts[kind.endswith(BUSY)] += n
    return counts[False], counts[True]


def _saturated(r: dict) -> str:
    """Whether the master said it was behind, in a size's window."""
    sat = r.get("saturation") or {}
    if not sat.get("began") and not sat.get("behind_at_end"):
        return "no"
    spells = f"{sat['began']} began, {sat['ended']} ended"
    return f"**behind** ({spells})" if sat["behind_at_end"] else f"caught up ({spells})"


def _p99s(r: dict, kind: str) -> list[float]:
    return [p["p99_ms"][kind] for p in r["parts"] if p["p99_ms"].get(kind) is not None]


def summary(
    ladders: dict[str, list[dict]], knees: dict[str, dict], checks: dict[int, dict], step_s: float
) -> str:
    """The text summary: bench/results/many_workers.md."""
    lines = [
        f"# Many workers, by simulation ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"`bench/many_workers.py`: a PS job grown by Scale RPCs through the sizes, "
        f"{step_s * 1000:.0f} ms per minibatch, {PER_TASK} minibatches per task. Rates: "
        f"median of the {PARTS} parts of each window; latencies p50 / p99 (ms) over the "
        "window; CPU in % of one core; RSS at the window's end (its growth over the window); "
        "pace: what the workers would do if nothing held them back.",
    ]
    for ladder, results in ladders.items():
        found = knees[ladder]
        lines += [
            "",
            f"## {ladder}",
            "",
            *_table(results, step_s),
            "",
            f"Share of the pace of pushes kept: {found['share_of_pace']}. Knee (the "
            f"largest size keeping ≥ {KEPT}): **{found['knee_workers']} workers**; "
            f"first below: {found['first_below']}.",
        ]
        for r in results:
            for name, views in (r.get("profile") or {}).items():
                for view, prof in views.items() if isinstance(views, dict) else ():
                    if not prof.get("samples"):
                        continue
                    what = "holding the GIL" if view == "cpu" else "every thread"
                    lines += [
                        "",
                        f"py-spy, {name} at {r['workers']} workers, {what} ({prof['samples']} "
                        "samples; on the stack, then where sampled):",
                        "",
                        "    " + ", ".join(f"{f} {s:.0%}" for f, s in prof["inclusive"]),
                        "    " + ", ".join(f"{f} {s:.0%}" for f, s in prof["self"]),
                    ]
    if len(checks) == 2:
        lines += ["", "## The load generators: the same size, fresh master-alone jobs", ""]
        lines += [f"- {g} generators: {_line(r, step_s)}" for g, r in sorted(checks.items())]
    return "\n".join(lines) + "\n"


def _table(results: list[dict], step_s: float) -> list[str]:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values):,.0f}" if values else "—"

    def lat(r: dict, kind: str) -> str:
        got = r["latency_ms"].get(kind)
        return f"{got['p50']:.1f} / {got['p99']:.0f}" if got else "—"

    def proc(p: dict) -> str:
        if p["cpu_percent"] is None:
            return "exited"
        grew = p["rss_mb"] - (p["rss_mb_before"] or p["rss_mb"])
        return f"{p['cpu_percent']:.0f}% · {p['rss_mb']:.0f} MB ({grew:+.0f}) · {p['threads']} thr"

    lines = [
        "| workers | hand-outs/s (pace) | pushes/s (pace) | reports/s | GetTask→task | report "
        "| push+pull | master | events/s | PS | PS sockets | generators: CPU, loop lag p99 "
        "| epochs begun | errors (busy) | master saturated | trouble |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|---:|---:|---|---|",
    ]
    for r in results:
        pace_tasks, pace_pushes = _pace(r["workers"], step_s)
        procs = r["processes"]
        gens = " + ".join(
            f"{p['cpu_percent']:.0f}%"
            for name, p in procs.items()
            if name.startswith("generator") and p["cpu_percent"] is not None
        )
        lag = max((p["loop_lag_p99_ms"] or 0) for p in r["parts"])
        errors, busy = _errors(r)
        trouble = ", ".join(f"{k} {v}" for k, v in r["trouble"].items() if v) or "none"
        lines.append(
            f"| {r['workers']} | {med(_rate(r, 'tasks'))} ({pace_tasks:,.0f}) "
            f"| {med(_rate(r, 'pushes'))} ({pace_pushes:,.0f}) | {med(_rate(r, 'reports'))} "
            f"| {lat(r, 'get_task:training')} | {lat(r, 'report')} | {lat(r, 'exchange')} "
            f"| {proc(procs['master'])} | {r['events_per_s']:,.0f} | {proc(procs['ps'])} "
            f"| {procs['ps'].get('sockets', '—')} | {gens}, {lag:.0f} ms | {r['epochs_begun']} "
            f"| {errors} ({busy}) | {_saturated(r)} | {trouble} |"
        )
    return lines


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (ends every job it started)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter windows")
    parser.add_argument("--sizes", help="worker counts, e.g. 10,100 (default: by mode)")
    parser.add_argument("--step-ms", type=float, default=100.0, help="a minibatch's compute")
    parser.add_argument("--generators", type=int, default=2, help="load-generator processes")
    parser.add_argument("--ladders", default=",".join(LADDERS), help="which ladders to run")
    parser.add_argument(
        "--check-size",
        type=int,
        default=0,
        help="the generator check's size (0: the first size below the master's knee)",
    )
    parser.add_argument("--no-check", action="store_true", help="no generator check")
    args = parser.parse_args()
    started = time.monotonic()
    pin_threads()
    sizes = tuple(int(n) for n in args.sizes.split(",")) if args.sizes else None
    sizes = sizes or (QUICK_SIZES if args.quick else SIZES)
    s = Settings(
        step_s=args.step_ms / 1000,
        warmup_s=3.0 if args.quick else 6.0,
        part_s=2.0 if args.quick else 5.0,
        profile_s=0.0 if args.quick else 5.0,
    )
    ladders, knees, checks = {}, {}, {}
    with job_home():
        for ladder in args.ladders.split(","):
            ladders[ladder] = run_ladder(ladder, sizes, s, args.generators)
            knees[ladder] = knee(ladders[ladder], s.step_s)
        # Where the master-alone job first falls behind its workers' pace: if the generators
        # were what held it back there, more of them would raise its figures.
        alone = knees.get("master alone") or next(iter(knees.values()))
        size = args.check_size or alone["first_below"] or sizes[-1]
        for generators in () if args.no_check else (args.generators, 2 * args.generators):
            checks[generators] = run_check(size, replace(s, profile_s=0.0), generators)
    text = summary(ladders, knees, checks, s.step_s)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{NAME}.md").write_text(text)
    print(text)
    details = {
        "ladders": ladders,
        "knees": knees,
        "generator_check": {str(g): r for g, r in checks.items()},
        "settings": asdict(s)
        | {"generators": args.generators, "ladders": {k: asdict(v) for k, v in LADDERS.items()}},
    }
    write_result(
        NAME,
        "Many workers, by simulation: a real master and PS under 10 to 1,000 simulated workers",
        result_rows(ladders, checks, s.step_s),
        details,
        command=f".venv/bin/python bench/{NAME}.py" + (" --quick" if args.quick else ""),
        seconds=time.monotonic() - started,
    )


if __name__ == "__main__":
    main()
