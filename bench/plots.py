"""PNG plots of the benchmark results (matplotlib, no display needed).

- `<benchmark>.png`: per benchmark, one panel per metric; for every case the median of
  ours beside the baseline's, with the min–max spread of the runs as error bars.
- `ratios.png`: every ratio against the baseline, grouped by benchmark on a log axis, with
  the targets marked.
- `scaling.png`: samples/s and communication share against the worker count.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OURS, BASE = "#1f77b4", "#bbbbbb"


def _bar(ax, x: float, stats: dict | None, color: str, width: float, label: str | None) -> None:
    if not stats or stats["median"] is None:
        return
    m = stats["median"]
    err = [[m - stats["min"]], [stats["max"] - m]]
    ax.bar(x, m, width, color=color, yerr=err, capsize=3, label=label)


def benchmark_panels(name: str, doc: dict, out: Path) -> Path | None:
    by_metric: dict[tuple[str, str], list[dict]] = {}
    for r in doc["rows"]:
        if r["ours"]["median"] is not None:
            by_metric.setdefault((r["metric"], r["unit"]), []).append(r)
    if not by_metric:
        return None
    fig, axes = plt.subplots(
        1, len(by_metric), figsize=(4.2 * len(by_metric) + 1, 4.2), squeeze=False
    )
    for ax, ((metric, unit), rows) in zip(axes[0], by_metric.items()):
        for i, r in enumerate(rows):
            _bar(ax, i - 0.2, r["ours"], OURS, 0.4, "ours" if i == 0 else None)
            label = (r["baseline_label"] or "baseline") if i == 0 else None
            _bar(ax, i + 0.2, r["baseline"], BASE, 0.4, label)
        ax.set_xticks(range(len(rows)), [textwrap.fill(r["case"], 22) for r in rows], fontsize=7)
        ax.set_title(textwrap.fill(metric, 40), fontsize=9)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    fig.suptitle(doc["title"], fontsize=10)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def ratios(results: dict, out: Path) -> Path | None:
    """Every ratio, grouped by benchmark, on a log axis (ratios run from 0.2 to several
    hundred): each bar grows from 1 (as good as the baseline) to the ratio, so worse and
    better read alike, with its value written at its end and its target marked."""
    groups = [
        (name, [r for r in doc.get("rows", []) if r["ratio"] is not None and r["ratio"] > 0])
        for name, doc in results.items()
    ]
    groups = [(name, rows) for name, rows in groups if rows]
    if not groups:
        return None
    count = sum(len(rows) + 1 for _, rows in groups)
    fig, ax = plt.subplots(figsize=(11, 0.34 * count + 1.4))
    labels, y = [], 0
    for name, rows in groups:
        ax.axhline(y - 0.5, color="#dddddd", linewidth=0.8)
        ax.text(1.0, y, f"  {name}", fontsize=8, fontweight="bold", va="center", ha="left")
        labels.append("")
        y += 1
        for r in rows:
            color = {True: "#2ca02c", False: "#d62728"}.get(r["met"], OURS)
            ratio = r["ratio"]
            ax.barh(y, ratio - 1, left=1, color=color, height=0.7)
            ax.text(
                ratio,
                y,
                f" {ratio:.2f} ",
                fontsize=6.5,
                va="center",
                ha="left" if ratio >= 1 else "right",
            )
            if r["target"] is not None:
                ax.plot([r["target"]] * 2, [y - 0.45, y + 0.45], color="black", linewidth=2)
            labels.append(textwrap.shorten(f"{r['case']} ({r['metric']})", 90))
            y += 1
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    low = min(r["ratio"] for _, rows in groups for r in rows)
    high = max(r["ratio"] for _, rows in groups for r in rows)
    ax.set_xlim(min(0.5, low / 1.6), max(2.0, high * 1.6))
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(
        "times better than the baseline, log scale (black tick: target; green met, red not)"
    )
    fig.tight_layout()
    path = out / "ratios.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def scaling(doc: dict, out: Path) -> Path | None:
    rate, share = {}, {}
    for r in doc["rows"]:
        workers = int(r["case"].split(",")[1].split()[0])
        target = rate if r["metric"].startswith("samples/s") else share
        if r["ours"]["median"] is not None:
            target[workers] = r["ours"]["median"]
    if not rate:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = sorted(rate)
    ax.plot(xs, [rate[x] for x in xs], "o-", color=OURS, label="samples/s")
    ax.set_xlabel("workers (1 PS, 2 cores)")
    ax.set_ylabel("samples/s")
    ax.set_xticks(xs)
    if share:
        ax2 = ax.twinx()
        xs2 = sorted(share)
        ax2.plot(xs2, [share[x] for x in xs2], "s--", color="#ff7f0e", label="communication")
        ax2.set_ylabel("communication share of worker time")
        ax2.set_ylim(0, 1)
        ax2.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(doc["title"], fontsize=10)
    fig.tight_layout()
    path = out / "scaling.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def elastic_scheduling(doc: dict, out: Path) -> Path | None:
    """ElasticDL's figure: the CPU each job requests over time, gang above, elastic below,
    a column per strategy (A: PS jobs, C: allreduce jobs), against the node's allocatable
    CPU."""
    runs = doc.get("details", {}).get("runs", {})
    allocatable = doc.get("details", {}).get("allocatable_m")
    if not runs or not allocatable:
        return None
    if "gang" in runs:  # (a result from before C: the PS runs only)
        runs = {"ps": runs}
    fig, axes = plt.subplots(
        2, len(runs), figsize=(6 * len(runs), 4.8), sharex="col", squeeze=False
    )
    colors = {"a": OURS, "b": "#ff7f0e"}
    facts = doc.get("details", {}).get("by_strategy", {})
    for col, (strategy, modes) in enumerate(runs.items()):
        node_m = (facts.get(strategy) or {}).get("allocatable_m") or allocatable
        for ax, (mode, run) in zip(axes[:, col], modes.items()):
            samples = [s for s in run["samples"] if "error" not in s]
            ts = [s["t"] - run["t0"] for s in samples]
            names = {k: v["name"] for k, v in run["jobs"].items()}
            stacks = [[s["requested"].get(names[k], 0) / 1000 for s in samples] for k in names]
            ax.stackplot(
                ts,
                *stacks,
                labels=[f"job {k}" for k in names],
                colors=[colors.get(k, "#999") for k in names],
                alpha=0.8,
                step="post",
            )
            ax.axhline(
                node_m / 1000, color="#444", linestyle="--", linewidth=1, label="allocatable"
            )
            ax.axvline(run["makespan_s"], color="#d62728", linewidth=1, label="makespan")
            ax.set_ylabel("CPU requested")
            ax.set_title(
                f"{strategy} on {node_m}m, {mode}: makespan {run['makespan_s']:.0f} s", fontsize=9
            )
            ax.legend(loc="upper right", fontsize=7)
        axes[-1, col].set_xlabel("seconds since the first job's submission")
    fig.suptitle(doc["title"], fontsize=10)
    fig.tight_layout()
    path = out / f"{doc.get('benchmark', 'elastic_scheduling')}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def elastic_service(doc: dict, out: Path) -> Path | None:
    """ElasticDL's experiment B: the CPU the job and the service request over time, the
    service's scale changes marked, against the node's allocatable CPU."""
    beside = doc.get("details", {}).get("beside")
    allocatable = doc.get("details", {}).get("allocatable_m")
    if not beside or not allocatable:
        return None
    samples = [s for s in beside["samples"] if "error" not in s]
    ts = [s["t"] - beside["t0"] for s in samples]
    fig, ax = plt.subplots(figsize=(7, 2.8))
    workers = doc["details"].get("workers", "")
    keys = {f"job (workers {workers})": beside["name"], "service": "service"}
    ax.stackplot(
        ts,
        *[[s["requested"].get(name, 0) / 1000 for s in samples] for name in keys.values()],
        labels=list(keys),
        colors=[OURS, "#d62728"],
        alpha=0.8,
        step="post",
    )
    ax.axhline(allocatable / 1000, color="#444", linestyle="--", linewidth=1, label="allocatable")
    for t, replicas in beside["changes"]:
        ax.axvline(t, color="#999", linewidth=0.8)
        ax.text(t, allocatable / 1000 * 1.02, f"{replicas}", fontsize=7, ha="center")
    ax.set_xlim(min(ts, default=0), beside["window_s"] + 30)
    ax.set_ylabel("CPU requested")
    ax.set_xlabel("seconds since the service's first scale call (its replicas above)")
    ax.legend(loc="lower left", fontsize=7)
    ax.set_title(f"{doc['title']}: {beside['utilization']:.2f} of the node requested", fontsize=9)
    fig.tight_layout()
    path = out / "elastic_service.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def draw(results: dict, out: Path) -> list[Path]:
    """Every plot the results allow; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [ratios(results, out)]
    for name, doc in results.items():
        if "rows" in doc:
            written.append(benchmark_panels(name, doc, out))
    if "rows" in results.get("scaling", {}):
        written.append(scaling(results["scaling"], out))
    for name in ("elastic_scheduling", "elastic_scheduling_reserved"):  # (over its panels)
        if "rows" in results.get(name, {}):
            written.append(elastic_scheduling(results[name], out))
    if "rows" in results.get("elastic_service", {}):
        written.append(elastic_service(results["elastic_service"], out))
    return [p for p in written if p is not None]
