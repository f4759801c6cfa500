"""A job's events and figures in words: the one place they are phrased, for the text
progress, the dashboard's log and header, and the sidebar's summary alike.

`describe(event)` gives the line a notable event gets (instances ending or relaunching,
re-queued work, evaluations, the end of the job; None for routine ones); the `format_*`
functions phrase the progress, the goodput and the stragglers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticdl_nb.vocabulary import (
    INSTANCE_ENDED,
    Event,
    EventKind,
    GroupChange,
    InstanceState,
    JobState,
)

# How an instance can be lost: it ended, and not by finishing its work.
INSTANCE_LOST = INSTANCE_ENDED - {InstanceState.SUCCEEDED}


def format_progress(data: dict) -> str:
    """The progress line: epoch, records (and their share), step and rate, from the
    fields of a `progress` event."""
    total = data.get("records_per_epoch") or 0
    done = data.get("records_done", 0)
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    return (
        f"epoch {data.get('epoch', 0) + 1}/{data.get('epochs', '?')} | "
        f"{done}/{total} records{pct} | step {data.get('step', 0)} | "
        f"{data.get('records_per_second', 0):.0f} rec/s"
    )


def format_goodput(goodput: float | None) -> str:
    """`goodput 0.93` (`0.996` rather than a `1.00` that is not one), or "" while there is
    none (before the first minibatch)."""
    if goodput is None:
        return ""
    text = f"{goodput:.2f}"
    return f"goodput {f'{goodput:.3f}' if text == '1.00' and goodput < 1 else text}"


def format_percent(share: float) -> str:
    """`93 %` (`99.6 %` rather than a `100 %` that is not one), as the sidebar says it."""
    percent = 100 * min(1.0, max(0.0, share))
    text = f"{percent:.0f}"
    return f"{f'{percent:.1f}' if text == '100' and percent < 100 else text} %"


def format_stragglers(stragglers: dict[int, dict]) -> str:
    """`straggler: worker 2 (2.6× median)` for the workers flagged (their `straggler`
    events' data, by worker), or "" for none."""
    if not stragglers:
        return ""
    named = ", ".join(f"worker {w}{times_median(d)}" for w, d in sorted(stragglers.items()))
    return f"straggler{'s' if len(stragglers) > 1 else ''}: {named}"


def times_median(straggler: dict) -> str:
    """` (2.6× median)` from a `straggler` event's data ("" without a ratio)."""
    ratio = straggler.get("ratio")
    return f" ({ratio:.1f}× median)" if ratio else ""


def job_figures(
    goodput: float | None, workers: dict[str, Any], stragglers: dict[int, dict]
) -> list[str]:
    """The parts of a progress line after the progress itself: goodput, the workers
    (`JobView.workers_summary`), stragglers (the text progress and the dashboard say the
    same)."""
    parts = [format_goodput(goodput), format_workers(workers)]
    return [p for p in (*parts, format_stragglers(stragglers)) if p]


def format_workers(w: dict[str, Any]) -> str:
    """'workers 3/4 (range 2:4), 1 pending: unschedulable: 0/1 nodes are available: 1
    Insufficient cpu.', from a `JobView.workers_summary`; then why training waits, and
    what the throughput policy does ('holding at 3: the 4th added 2%')."""
    desired = w.get("desired") or "?"
    text = f"workers {w['live']}/{desired}"
    if w.get("min"):
        text += f" (range {w['min']}:{desired})"
    if w.get("pending"):
        text += f", {w['pending']} pending"
        if w.get("pending_reason"):
            text += f": {w['pending_reason']}"
    if w.get("waiting"):
        text += f"; waiting for workers: {w['waiting']}"
    if w.get("growth"):
        text += f"; {w['growth']}"
    return text


def _number(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else str(value)


def describe(event: Event) -> str | None:
    """One line for a notable event, or None for routine ones (`_PHRASES`: one phrase per
    kind)."""
    phrase = _PHRASES.get(event.kind)
    return phrase(event.data) or None if phrase is not None else None


def _instance(d: dict) -> str | None:
    if d.get("kind") == InstanceState.PENDING:
        return f"{d['role']} {d['id']} pending: {d.get('reason', '')}"
    if d.get("kind") not in INSTANCE_LOST or d.get("expected"):
        return None
    reason = d.get("reason") or d["kind"]
    # a platform may not call it a preemption ("Evicted: ...")
    if d["kind"] == InstanceState.PREEMPTED and "preempt" not in reason.lower():
        reason = f"preempted: {reason}"
    return f"{d['role']} {d['id']} {reason}"


def _export(d: dict) -> str:
    if d.get("tables"):
        return (
            f"embedding tables too large for a Keras file: exported as (id, vector) "
            f"files to {d['path']} (elasticdl_nb.load_embeddings reads them)"
        )
    exported = [f"model exported to {d['path']}"] if d["path"] else []
    if d.get("saved_model"):  # (export_format saved_model or both)
        exported.append(f"SavedModel exported to {d['saved_model']}")
    return "; ".join(exported)


def _job_state(d: dict) -> str:
    if d["state"] == JobState.RUNNING:
        return "job started" + (" (Keras 2: tf_keras)" if d.get("keras") == "2" else "")
    reason = f": {d['reason']}" if d.get("reason") else ""
    # The job's last word on goodput: the last progress line may be seconds older.
    goodput = f" ({format_goodput(d['goodput'])})" if d.get("goodput") is not None else ""
    return f"job {d['state']}{reason}{goodput}"


def _evaluation(d: dict) -> str:
    metrics = ", ".join(f"{k} {_number(v)}" for k, v in d["metrics"].items())
    return f"evaluation at step {d['step']}: {metrics}"


def _checkpoint(d: dict) -> str:
    versions = ", ".join(str(v) for v in d.get("versions", []))
    return f"{'final ' if d.get('final') else ''}checkpoint taken (PS versions {versions})"


def _straggler(d: dict) -> str:
    return (
        f"worker {d['worker']} is a straggler: {d['step_s']:.3g} s per minibatch, "
        f"{d['ratio'] or float('inf'):.1f}× the median of the others "
        f"({d['median_s']:.3g} s) for {d['lagging_s']:.0f} s"
    )


def _master_restarted(d: dict) -> str:
    return (
        f"master restarted (#{d['incarnation']}): rebuilt from {d['replayed']} events in "
        f"{_milliseconds(d['rebuild_s'])}, {d['down_s']:.1f} s after the last one's last "
        f"event; {d['adopted']} instances went on in their processes"
    )


def format_saturated(d: dict) -> str:
    """`master behind its workers: 256 calls held, 2,400 turned away` from a
    `master_saturated` event's data."""
    turned = f", {d['turned_away']:,} turned away" if d.get("turned_away") else ""
    waited = f", a call waited {d['longest_wait_s']:.1f} s" if d.get("longest_wait_s") else ""
    return f"master behind its workers: {d.get('calls', 0):,} calls held{turned}{waited}"


def _caught_up(d: dict) -> str:
    return (
        f"master caught up after {d['seconds']:.0f} s behind: served {d['served']:,} "
        f"calls ({d['calls_per_s']:g}/s), turned {d['turned_away']:,} away, the longest "
        f"wait {d['longest_wait_s']:.1f} s"
    )


def _group_settled(d: dict) -> str:
    return (
        f"group v{d['version']} stepping again at step {d['step']}: "
        f"{_milliseconds(d['seconds'])} after the {_CAUSES.get(d['cause'], d['cause'])}"
    )


def _peer_unreachable(d: dict) -> str:
    spells = f" ({d['times']} times)" if d.get("times", 1) > 1 else ""
    end = "answered again" if d.get("healed") else "given up on"
    return (
        f"{d['by']} could not reach {d['peer']} for {d.get('seconds', 0):.1f} s"
        f"{spells}, then {end}: {d.get('detail', '')}"
    )


# The kinds that get a line of their own, and how it reads (None or "": no line this time).
_PHRASES: dict[EventKind, Callable[[dict], str | None]] = {
    EventKind.INSTANCE: _instance,
    EventKind.PENDING_TOO_LONG: lambda d: (
        f"{d['role']} {d['id']} still not started after {d['seconds']:.0f} s: {d['reason']}"
    ),
    EventKind.MEMORY_RAISED: lambda d: (
        f"{d['role']} {d['id']} ran out of memory: next {d['role']}s get {d['memory']}"
    ),
    EventKind.RELAUNCH: lambda d: (
        f"standby worker {d['id']} takes the place of {d['replaces']} ({d['reason']})"
        if d.get("promoted")
        else f"relaunched {d['role']} {d['id']} (replacing {d['replaces']}: {d['reason']})"
    ),
    EventKind.RELAUNCH_REFUSED: lambda d: f"not relaunching {d['role']} {d['id']}: {d['reason']}",
    EventKind.REQUEUE: lambda d: (
        f"re-queued {d['batches']} minibatches of epoch {d.get('epoch', 0) + 1}"
        if d.get("batches")
        else None
    ),
    EventKind.PS_RESTORED: lambda d: (
        f"PS {d['ps']} restored version {d['restored_version']}; "
        f"{d['updates_rolled_back']} updates rolled back and redone"
    ),
    EventKind.SCALE: lambda d: (
        f"scaling workers {d['workers_from']} -> {d['workers_to']}"
        + (f" (range {d['min_workers']}:{d['workers_to']})" if d.get("min_workers") else "")
        if d["workers_from"] != d["workers_to"] or d.get("min_workers")
        else None
    ),
    EventKind.WORKER_FLOOR: lambda d: (
        f"waiting for workers: {d['running']} of at least {d['min']} running"
        + ("; training waits for them" if d["held"] else "; the group goes on with them")
        if d["below"]
        else f"{d['running']} workers running (at least {d['min']}): training goes on"
    ),
    EventKind.GROWTH: lambda d: f"throughput policy: {d['reason']}",
    EventKind.EVALUATION: _evaluation,
    EventKind.PREDICTIONS: lambda d: (
        f"predicted for {d['records']:,} records in {d['path']} (job.predictions() reads them)"
    ),
    EventKind.EXPORT: _export,
    EventKind.CHECKPOINT: _checkpoint,
    EventKind.PHASE: lambda d: f"phase: {d['phase']}",
    EventKind.GROUP: lambda d: _group_line(d),
    EventKind.GROUP_SETTLED: _group_settled,
    EventKind.PEER_UNREACHABLE: _peer_unreachable,
    EventKind.STRAGGLER: _straggler,
    EventKind.STRAGGLER_CLEARED: lambda d: (
        f"worker {d['worker']} is no longer a straggler ({d['reason']})"
    ),
    EventKind.MASTER_RESTARTED: _master_restarted,
    EventKind.MASTER_SATURATED: format_saturated,
    EventKind.MASTER_CAUGHT_UP: _caught_up,
    EventKind.JOB_STATE: _job_state,
}


_CAUSES = {
    GroupChange.FAILURE: "failure",
    GroupChange.JOINED: "join",
    GroupChange.LEFT: "leave",
    GroupChange.FORMED: "start",
}


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _group_line(d: dict) -> str:
    """An allreduce group version, and what made it."""
    members = ", ".join(str(w) for w in d["members"])
    line = f"allreduce group v{d['version']}: workers {members}"
    if d["reason"] == GroupChange.FAILURE:
        lost = ", ".join(str(w) for w in d["left"])
        return (
            f"{line} (worker {lost} lost at step {d.get('step', '?')}; "
            f"survivors agreed in {_milliseconds(d.get('agreed_s', 0))})"
        )
    if d["reason"] == GroupChange.RESTORED:
        lost = ", ".join(str(w) for w in d["left"])
        return (
            f"allreduce group v{d['version']}: every member lost (workers {lost}); the job "
            f"goes back to the replicas' checkpoint of step {d['step']}"
        )
    if d["reason"] == GroupChange.FORMED and d.get("restore"):
        return f"{line} (starting from the replicas' checkpoint {Path(d['restore']).name})"
    if d["joined"] and d["reason"] != GroupChange.FORMED:
        return f"{line} ({', '.join(str(w) for w in d['joined'])} joined)"
    if d["left"]:
        return f"{line} ({', '.join(str(w) for w in d['left'])} left)"
    return line
