"""What every benchmark shares: the result format, statistics, machine facts, thread pins.

A benchmark is a script `bench/<name>.py` that runs our system and its baseline side by
side (alternating where repeats are made), prints one line per ratio, and writes
`bench/results/<name>.json` with `write_result`. `bench/run.py` (`make bench`) runs them
all, merges the files into `bench/results.json`, draws the plots and the README table.

A result row compares one figure of ours with one of the baseline:

    row(case="CTR, 1 worker + 1 PS", metric="samples/s", ours=[...runs], baseline=[...runs],
        higher_is_better=True, target=0.8)

`ratio` is always "how many times better than the baseline we are" (ours/baseline when
higher is better, baseline/ours when lower is better), so `target` reads the same way
everywhere: ratio >= target is met. Rows without a baseline (e.g. "records applied
twice") carry `ours` only and an absolute `limit` instead.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from code_state import code_state  # bench/code_state.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
PY = sys.executable

# Thread pins. The machine has 2 cores; TensorFlow sizes its pools to the cores it sees,
# so without pins a worker, a PS and a master each start 2+ busy threads and fight.
# Every process of a job (they inherit the environment) and every multi-process baseline
# (`pinned_env()`) gets one intra-op and one inter-op thread per process. A single-process
# baseline (Keras fit in the benchmark's own process) is alone on the machine, so it gets
# the whole of it: `BASELINE_THREADS` intra-op and inter-op threads, what TensorFlow picks
# by itself here (bench/workloads.py sets them).
BASELINE_THREADS = os.cpu_count() or 1
THREAD_PINS = {
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def pin_threads(pins: dict[str, str] | None = None) -> dict[str, str]:
    """Set the thread pins in this process's environment (before TensorFlow starts)."""
    pins = dict(THREAD_PINS if pins is None else pins)
    os.environ.update(pins)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return pins


def pinned_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **THREAD_PINS, "TF_CPP_MIN_LOG_LEVEL": "2", **(extra or {})}


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports on 127.0.0.1, free a moment ago, for a baseline's processes
    to listen on once they have started.

    Drawn from below the kernel's ephemeral range. A port bound to 0 and released comes
    from that range, and any connect() on the machine may be given it before the baseline
    binds it: the baseline's own processes dialling each other while the last of them is
    still importing TensorFlow, or the previous job's teardown. Nothing takes a port below
    the range unless it asks for it by number."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()  # not the benchmark's seeded RNG: its draws stay the same
    ports: list[int] = []
    while len(ports) < n:
        port = draw.randrange(10_000, low)
        if port in ports:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


@contextlib.contextmanager
def job_home() -> Iterator[Path]:
    """A temporary ELASTICDL_NB_HOME for the benchmark's jobs (never the user's
    ~/.elasticdl-nb), removed afterwards with everything the jobs wrote."""
    home = Path(tempfile.mkdtemp(prefix="edl-bench-"))
    before = os.environ.get("ELASTICDL_NB_HOME")
    os.environ["ELASTICDL_NB_HOME"] = str(home)
    try:
        yield home
    finally:
        if before is None:
            os.environ.pop("ELASTICDL_NB_HOME", None)
        else:
            os.environ["ELASTICDL_NB_HOME"] = before
        shutil.rmtree(home, ignore_errors=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Median and spread of repeated measurements (runs kept, rounded for reading)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "runs": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "runs": [round(v, 6) for v in values],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def row(
    case: str,
    metric: str,
    ours: Sequence[float],
    baseline: Sequence[float] | None = None,
    *,
    unit: str = "",
    baseline_label: str = "",
    higher_is_better: bool = True,
    target: float | None = None,
    limit: float | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One comparison; see the module docstring for `ratio`, `target` and `limit`."""
    o = stats(ours)
    b = stats(baseline) if baseline is not None else None
    ratio = None
    if b and o["median"] and b["median"]:
        ratio = o["median"] / b["median"] if higher_is_better else b["median"] / o["median"]
    met = None
    if target is not None and ratio is not None:
        met = ratio >= target
    if limit is not None and o["median"] is not None:
        worst = o["min"] if higher_is_better else o["max"]
        met = worst >= limit if higher_is_better else worst <= limit
    return {
        "case": case,
        "metric": metric,
        "unit": unit,
        "ours": o,
        "baseline": b,
        "baseline_label": baseline_label,
        "higher_is_better": higher_is_better,
        "ratio": ratio,
        "target": target,
        "limit": limit,
        "met": met,
        "note": note,
    }


def describe(r: dict[str, Any]) -> str:
    """The one line a benchmark prints per row."""

    def fig(s: dict | None) -> str:
        if not s or s["median"] is None:
            return "—"
        spread = f" [{s['min']:.4g}..{s['max']:.4g}]" if s["n"] > 1 else ""
        return f"{s['median']:.4g}{spread}"

    text = f"{r['case']}: {r['metric']} ours {fig(r['ours'])} {r['unit']}".rstrip()
    if r["baseline"]:
        text += f" vs {r['baseline_label'] or 'baseline'} {fig(r['baseline'])}"
    if r["ratio"] is not None:
        text += f" -> ratio {r['ratio']:.3f}"
    if r["target"] is not None:
        text += f" (target >= {r['target']}: {'met' if r['met'] else 'NOT met'})"
    if r["limit"] is not None:
        bound = ">=" if r["higher_is_better"] else "<="
        text += f" (limit {bound} {r['limit']}: {'met' if r['met'] else 'NOT met'})"
    return text


def machine() -> dict[str, Any]:
    """Where and with what the numbers were measured."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = f"{int(Path('/proc/meminfo').read_text().split()[1]) / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        mem = ""
    versions = {}
    for module in ("tensorflow", "keras", "numpy", "grpc", "elasticdl_nb"):
        mod = sys.modules.get(module)
        if mod is not None:
            versions[module] = getattr(mod, "__version__", "?")
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "versions": versions,
        "thread_pins": {k: os.environ.get(k) for k in THREAD_PINS},
        "code": code_state(),
    }


def write_result(
    name: str,
    title: str,
    rows: list[dict[str, Any]],
    details: dict[str, Any] | None = None,
    *,
    command: str | None = None,
    seconds: float | None = None,
) -> Path:
    """Print every row and write bench/results/<name>.json."""
    for r in rows:
        print("RESULT " + describe(r), flush=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "title": title,
        "command": command or f".venv/bin/python bench/{name}.py",
        "seconds": seconds,
        "machine": machine(),
        "rows": rows,
        "details": details or {},
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    log(f"wrote {path.relative_to(ROOT)}")
    return path
