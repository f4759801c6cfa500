"""The dashboard's HTML, drawn from a `JobView`: the status (header, progress bar and
progress figures), the details (instances table and event log) and where the job's
TensorBoard log is.

Plain functions of the view and the time, no widgets: `Dashboard` puts what they return
into two HTML widgets, one message each (a progress bar drawn here costs no widget of its
own). Every value from the job is escaped.
"""

from __future__ import annotations

import html
import shlex
import time

from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.sdk.view.text import (
    INSTANCE_LOST,
    format_percent,
    format_progress,
    format_saturated,
    format_stragglers,
    format_workers,
    times_median,
)
from elasticdl_nb.vocabulary import GroupChange, JobState, Phase, Role

STATE_COLORS = {
    JobState.STARTING: "#888",
    JobState.RUNNING: "#1a7f37",
    JobState.SUCCEEDED: "#0b5cad",
    JobState.FAILED: "#c62828",
    JobState.STOPPED: "#9a6700",
}
ERROR_COLOR = "#c62828"
WARNING_COLOR = "#b35c00"  # a straggler: slow, not failed
# What an allreduce group's change is called in "last recovery stepping again in ..."
_CHANGES = {GroupChange.FAILURE: "recovery", GroupChange.JOINED: "join", GroupChange.LEFT: "leave"}


def colored(text: str, color: str) -> str:
    """`text`, escaped, in `color`."""
    return f'<span style="color:{color}">{html.escape(text)}</span>'


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def status_html(view: JobView, now: float) -> str:
    """Header, progress bar and progress figures: the part that changes every render."""
    e = html.escape
    color = STATE_COLORS.get(view.state, "#555")
    head = [
        f"<b>{e(view.name)}</b>",
        f'<span style="color:#888">{e(view.backend)}</span>',
        f'<b style="color:{color}">{e(view.state)}</b>',
    ]
    if not view.ended and view.phase == Phase.PREDICTING:
        head.append(f"predicting ({view.predicted:,} records done)")
    elif not view.ended and view.phase != Phase.TRAINING:
        head.append(e(view.phase))
    elif not view.ended and view.evaluating is not None:
        head.append(f"evaluating (round {view.evaluating})")
    head.append(f"elapsed {_duration(view.elapsed(now))}")
    eta = view.eta(now)
    if eta is not None:
        head.append(f"ETA {_duration(eta)}")
    goodput = view.goodput()
    if goodput is not None:  # (training vs recovering: README, "Goodput")
        training = float(view.progress.get("training_s") or 0)
        recovering = float(view.progress.get("recovering_s") or 0)
        spent = f" ({recovering:.0f} of {training + recovering:.0f} worker-s recovering)"
        head.append(
            '<span class="edl-goodput" title="worker time training over worker time wanted">'
            f"goodput {format_percent(goodput)}{spent if recovering else ''}</span>"
        )
    if view.master_restarts:
        head.append(colored(f"master restarted {view.master_restarts}×", ERROR_COLOR))
    total, done = view.records_total(), view.records_done()
    if total:
        fraction = min(1.0, done / total)
    else:
        fraction = 1.0 if view.state == JobState.SUCCEEDED else 0.0
    bar_color = STATE_COLORS.get(view.state, "#1a7f37")
    # Drawn in this HTML rather than as an IntProgress widget: one message per render, not
    # three; the role and aria values make it a progress bar to assistive tools and tests.
    bar = (
        f'<div class="edl-progress" role="progressbar" aria-valuemin="0" aria-valuemax="100" '
        f'aria-valuenow="{100 * fraction:.1f}" style="background:#e6e6e6;height:8px;'
        'border-radius:4px;margin:4px 0;max-width:640px"><div style="width:'
        f'{100 * fraction:.1f}%;height:100%;background:{bar_color};border-radius:4px"></div>'
        "</div>"
    )
    figures = []
    if view.progress:
        figures.append(e(format_progress({"epochs": view.epochs or "?", **view.progress})))
    if view.tasks_total:
        figures.append(f"tasks {view.tasks_done}/{view.tasks_total}")
    if view.last_loss is not None:
        figures.append(f"loss {view.last_loss:.4g}")
    workers = view.workers_summary()
    line = e(format_workers(workers))
    figures.append(colored(line, WARNING_COLOR) if workers["waiting"] else line)
    if view.stragglers:
        figures.append(colored(format_stragglers(view.stragglers), WARNING_COLOR))
    if view.master_saturated:
        figures.append(colored(e(format_saturated(view.master_saturated)), WARNING_COLOR))
    if view.ps:
        figures.append(f"PS {view.ps}")
    if view.group_version:
        group = f"group v{view.group_version} ({len(view.group_members)} members)"
        if view.last_change:
            cause, seconds = view.last_change
            group += f", last {_CHANGES.get(cause, cause)} stepping again in {seconds:.3g} s"
        figures.append(e(group))
    figures_line = " | ".join(figures)
    reason = ""
    if view.ended and view.reason:
        color = ERROR_COLOR if view.state == JobState.FAILED else "#555"
        reason = f"<div>{colored(view.reason, color)}</div>"
    return (
        '<div style="font-size:13px;line-height:1.5">'
        f"<div>{' · '.join(head)}</div>{bar}<div>{figures_line}</div>{reason}</div>"
    )


def details_html(view: JobView) -> str:
    """The instances table and the event log, newest line at the bottom."""
    e = html.escape
    cell = 'style="padding:1px 10px 1px 0;text-align:left"'
    rows = [
        "<tr>"
        + "".join(
            f"<th {cell}>{h}</th>"
            for h in ("role", "id", "state", "restarts", "exit", "reason", "pid")
        )
        + "</tr>"
    ]
    for r in view.rows():
        exit_ = r.signal or ("" if r.exit_code is None else str(r.exit_code))
        restarts = str(r.restarts) + (f" (replaces {r.replaces})" if r.replaces is not None else "")
        color = ERROR_COLOR if r.state in INSTANCE_LOST else "inherit"
        state = r.state
        straggler = view.stragglers.get(r.id) if r.role == Role.WORKER else None
        if straggler is not None:
            color, state = WARNING_COLOR, f"{r.state}, straggler{times_median(straggler)}"
        values = (r.role, r.id, state, restarts, exit_, r.reason, r.pid or "")
        rows.append(
            f'<tr style="color:{color}">'
            + "".join(f"<td {cell}>{e(str(v))}</td>" for v in values)
            + "</tr>"
        )
    table = (
        '<table class="edl-instances" style="font-size:12px;border-collapse:collapse">'
        f"{''.join(rows)}</table>"
    )
    # column-reverse keeps the box scrolled to its bottom (the newest line) in browsers;
    # so the newest line comes first in the markup.
    lines = []
    for line in reversed(view.log):
        stamp = time.strftime("%H:%M:%S", time.localtime(line.time))
        text = colored(line.text, ERROR_COLOR) if line.error else e(line.text)
        lines.append(f'<div><span style="color:#888">{stamp}</span> {text}</div>')
    log = (
        '<div class="edl-events" style="max-height:180px;overflow-y:auto;display:flex;'
        "flex-direction:column-reverse;font-family:var(--jp-code-font-family,monospace);"
        'font-size:12px;border-top:1px solid #ddd;margin-top:6px;padding-top:4px">'
        + ("".join(lines) or '<div style="color:#888">no events yet</div>')
        + "</div>"
    )
    return table + log


def tensorboard_html(view: JobView) -> str:
    """Where the job's TensorBoard log is and the notebook lines that show it ("" when the
    job writes none): text to copy, not a TensorBoard of its own."""
    if not view.tensorboard_dir:
        return ""
    e = html.escape
    code = 'style="font-family:var(--jp-code-font-family,monospace)"'
    return (
        '<div class="edl-tensorboard" style="font-size:12px;color:#555;margin-top:4px">'
        f"TensorBoard log: <code {code}>{e(view.tensorboard_dir)}</code>; to see it in a "
        f"cell: <code {code}>%load_ext tensorboard</code> then <code {code}>"
        f"%tensorboard --logdir {e(shlex.quote(view.tensorboard_dir))}</code></div>"
    )
