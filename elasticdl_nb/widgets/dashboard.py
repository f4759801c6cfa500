"""`Dashboard`: the live job dashboard in a notebook, ipywidgets plus a plotly FigureWidget.

Two daemon threads per dashboard, nothing shared between dashboards:

- the reader follows `job.events(follow=True)` from seq 0 and folds every event into a
  `JobView` (job_view.py) under a lock; it never touches a widget;
- the renderer wakes every `interval` seconds and pushes what changed into widget traits.
  Only traits: never `print` or `with output:` from a thread, which would write into
  whichever cell happens to be running.

What the front end receives is kept to a few messages a second however fast events come
(issue target: about 4 a second). A render sends one message per widget that changed,
so everything that changes often lives in few widgets: `status` (header, progress bar and
figures, one HTML widget, at most every `interval`), the curves (one figure update, at
most every `figure_interval`) and `details` (instances table and event log, one HTML
widget, only when they changed, at the same slower pace). Controls: a worker count with
"Scale", and "Stop", which asks for a second click first.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.serializers import custom_serializers
from traitlets import Dict

from elasticdl_nb.sdk.progress import LOST, format_progress
from elasticdl_nb.widgets.job_view import JobLike, JobView

CONFIRM_SECONDS = 5.0  # "Confirm stop" turns back into "Stop" after this long
STATE_COLORS = {
    "starting": "#888",
    "running": "#1a7f37",
    "succeeded": "#0b5cad",
    "failed": "#c62828",
    "stopped": "#9a6700",
}
ERROR_COLOR = "#c62828"
TRAINING_LOSS = "training loss"


class _LiveFigure(go.FigureWidget):
    """A FigureWidget that costs one message to the front end per update.

    plotly sends an update (and an added trace) as four state messages: the trace edit
    id, the layout edit id, the payload, then None in the payload's place. Here the ids and
    the payload travel in one `hold_sync` message; the payload is left in place rather than
    reset (every payload carries new edit ids, so the next one is still a change).

    The browser answers every update with the defaults Plotly.js computed (trace and
    layout deltas); plotly stores them and resets the two traits to None, and ipywidgets
    echoes each incoming value back: four more messages to the front end per update, for
    defaults this dashboard never reads. Here they are neither echoed nor reset.
    """

    _js2py_traceDeltas = Dict(allow_none=True).tag(
        sync=True, echo_update=False, **custom_serializers
    )
    _js2py_layoutDelta = Dict(allow_none=True).tag(
        sync=True, echo_update=False, **custom_serializers
    )

    def _handler_js2py_traceDeltas(self, change: Any) -> None:  # see the class docstring
        pass

    def _handler_js2py_layoutDelta(self, change: Any) -> None:
        pass

    def _send_in_one(self, trait: str, msg: dict[str, Any]) -> None:
        with self.hold_sync():
            self._last_trace_edit_id += 1
            self._last_layout_edit_id += 1
            msg["trace_edit_id"] = self._last_trace_edit_id
            msg["layout_edit_id"] = self._last_layout_edit_id
            setattr(self, trait, msg)

    def _send_update_msg(
        self, restyle_data, relayout_data, trace_indexes=None, source_view_id=None
    ) -> None:
        msg = {
            "style_data": restyle_data,
            "layout_data": relayout_data,
            "style_traces": self._normalize_trace_indexes(trace_indexes),
            "source_view_id": source_view_id,
        }
        self._send_in_one("_py2js_update", msg)

    def _send_addTraces_msg(self, new_traces_data) -> None:  # noqa: N802 (plotly's name)
        self._send_in_one("_py2js_addTraces", {"trace_data": new_traces_data})


class Dashboard:
    """The live dashboard of one job. Display it (it is the last value of a cell, or
    `display(dashboard)`); `widget` is its ipywidgets root."""

    def __init__(
        self,
        job: JobLike,
        *,
        interval: float = 0.5,
        figure_interval: float = 1.0,
        log_lines: int = 200,
        loss_points: int = 1024,
        start: bool = True,
    ):
        """`job`: an `elasticdl_nb.Job` (or anything `JobLike`). `interval`: seconds
        between renders of the status; `figure_interval`: between updates of the curves,
        the table and the log.
        `loss_points`: buckets of the downsampled loss curve (it draws up to twice as many
        points). `start=False` builds the widgets without following the job (`start()`)."""
        self.job = job
        self.interval = interval
        self.figure_interval = figure_interval
        self.view = JobView.for_job(job, log_lines=log_lines, loss_capacity=loss_points)
        self.renders = 0  # render passes that sent anything
        self.messages = 0  # widget updates sent (one message each)
        self.figure_updates = 0  # of which to the figure
        self.error: str | None = None  # why the reader stopped early, if it did
        self._view_lock = threading.Lock()  # the reader writes the view, renders read it
        self._push_lock = threading.RLock()  # renders and control callbacks set traits
        self._done = threading.Event()  # the reader has ended
        self._rendered_final = threading.Event()
        self._closed = False
        self._last_slow = float("-inf")  # monotonic time of the last curves/details pass
        self._drawn: dict[str, int] = {TRAINING_LOSS: 0}  # curve -> Series.version on screen
        self._traces: dict[str, int] = {}  # curve name -> trace index
        self._details_drawn = (-1, -1)
        self._stop_armed_at: float | None = None
        self._action: threading.Thread | None = None
        self._shown_in: int | None = None  # see elasticdl_nb.widgets.show
        self._build()
        self.render()
        self._reader = threading.Thread(
            target=self._follow, name=f"edl-dashboard-{job.name}-events", daemon=True
        )
        self._renderer = threading.Thread(
            target=self._render_loop, name=f"edl-dashboard-{job.name}-render", daemon=True
        )
        if start:
            self.start()

    # ------------------------------------------------------------------ widgets

    def _build(self) -> None:
        self.status = W.HTML()
        self.details = W.HTML()
        self.notice = W.HTML()
        self.workers_input = W.BoundedIntText(
            value=max(1, self.view.workers or 1),
            min=1,
            max=1024,
            description="workers",
            layout=W.Layout(width="150px"),
        )
        self.scale_button = W.Button(description="Scale", tooltip="set the number of workers")
        self.stop_button = W.Button(
            description="Stop", button_style="warning", tooltip="stop the job"
        )
        self.scale_button.on_click(self._on_scale)
        self.stop_button.on_click(self._on_stop)
        self.figure = _LiveFigure(
            data=[go.Scatter(x=[], y=[], mode="lines", name=TRAINING_LOSS)],
            layout=go.Layout(
                height=300,
                margin={"l": 55, "r": 55, "t": 30, "b": 40},
                xaxis={"title": {"text": "step"}},
                yaxis={"title": {"text": "training loss"}},
                yaxis2={
                    "title": {"text": "evaluation"},
                    "overlaying": "y",
                    "side": "right",
                    "showgrid": False,
                },
                legend={"orientation": "h", "y": 1.12},
                template="plotly_white",
            ),
        )
        self._traces[TRAINING_LOSS] = 0
        self._controls = W.HBox(
            [self.workers_input, self.scale_button, self.stop_button, self.notice]
        )
        self.widget = W.VBox([self.status, self._controls, self.figure, self.details])

    def _repr_mimebundle_(self, **kwargs: Any) -> dict | None:
        if self._shown_in is not None and self._shown_in == _execution_count():
            # show() displayed it in this very cell: its return value is not shown twice
            return {"text/plain": repr(self)}
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<Dashboard of job {self.view.name!r}: {self.view.state}>"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Follow the job's events from seq 0 and keep the widgets up to date."""
        self._reader.start()
        self._renderer.start()

    def close(self) -> None:
        """Stop updating (the reader stops at its next event) and close the widgets."""
        self._closed = True
        self._done.set()
        for w in (*self._controls.children, *self.widget.children, self.widget):
            w.close()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the job's events have ended and the final render is done."""
        return self._rendered_final.wait(timeout)

    def _follow(self) -> None:
        try:
            for event in self.job.events(from_seq=0, follow=True):
                if self._closed:
                    return
                with self._view_lock:
                    try:
                        self.view.apply(event)
                    except Exception as exc:  # one odd event must not end the dashboard
                        self.view.add_log(
                            event.seq,
                            event.time,
                            f"event {event.seq} ({event.kind}) not shown: {exc!r}",
                            error=True,
                        )
        except Exception as exc:  # shown in the widget: a thread's exception is otherwise lost
            self.error = f"stopped following the job's events: {exc!r}"
            with self._view_lock:
                self.view.add_log(self.view.last_seq, time.time(), self.error, error=True)
        finally:
            self._done.set()

    def _render_loop(self) -> None:
        try:
            while not self._done.wait(self.interval):
                self.render()
            if not self._closed:
                self.render(final=True)
        except Exception as exc:
            self.error = f"dashboard render failed: {exc!r}"
            with contextlib.suppress(Exception):  # the notice may be what failed
                self._say(self.error, error=True)
        finally:
            self._rendered_final.set()

    # ------------------------------------------------------------------ rendering

    def render(self, final: bool = False) -> int:
        """Push what changed into the widgets; returns how many widget updates were sent.
        The status each call; curves, table and log at most every `figure_interval`
        (and always when `final`)."""
        now = time.monotonic()
        slow = final or now - self._last_slow >= self.figure_interval
        curves: dict[str, tuple[list[float], list[float]]] = {}
        details = None
        with self._view_lock:
            view = self.view
            status = _status_html(view, time.time())
            ended = view.ended
            if slow:
                self._last_slow = now
                # Evaluation curves get their own names: an evaluation usually reports a
                # 'loss' too, which must not overwrite the training loss.
                named = [(f"eval {n}", s) for n, s in view.metrics.items()]
                for name, series in [(TRAINING_LOSS, view.loss), *named]:
                    if self._drawn.get(name) != series.version:
                        curves[name] = series.xy()
                        self._drawn[name] = series.version
                versions = (view.instances_version, view.log_version)
                if versions != self._details_drawn:
                    details = _details_html(view)
                    self._details_drawn = versions
        sent = 0
        with self._push_lock:
            sent += self._set(self.status, value=status)
            if details is not None:
                sent += self._set(self.details, value=details)
            if curves:
                sent += self._draw(curves)
            if self._stop_armed_at is not None and now - self._stop_armed_at > CONFIRM_SECONDS:
                sent += self._disarm_stop()
            if final and ended:  # a stream that broke off early leaves the controls usable
                for w in (self.workers_input, self.scale_button, self.stop_button):
                    sent += self._set(w, disabled=True)
            if final and self.error:
                sent += self._set(self.notice, value=_colored(self.error, ERROR_COLOR))
            if sent:
                self.renders += 1
        return sent

    def _set(self, widget: W.Widget, **traits: Any) -> int:
        """Set the traits that differ, as one message; returns 1 if one was sent."""
        changed = {k: v for k, v in traits.items() if getattr(widget, k) != v}
        if not changed:
            return 0
        with self._push_lock, widget.hold_sync():
            for name, value in changed.items():
                setattr(widget, name, value)
        self.messages += 1
        return 1

    def _draw(self, curves: dict[str, tuple[list[float], list[float]]]) -> int:
        """Update the curves (new evaluation metrics get a trace on the right axis)."""
        fig, sent = self.figure, 0
        new = [name for name in curves if name not in self._traces]
        if new:
            fig.add_traces(
                [
                    go.Scatter(
                        x=curves[n][0], y=curves[n][1], name=n, mode="lines+markers", yaxis="y2"
                    )
                    for n in new
                ]
            )
            for n in new:
                self._traces[n] = len(self._traces)
            sent += 1
        old = {n: xy for n, xy in curves.items() if n not in new}
        if old:
            with fig.batch_update():
                for name, (xs, ys) in old.items():
                    trace = fig.data[self._traces[name]]
                    trace.x, trace.y = xs, ys
            sent += 1
        self.messages += sent
        self.figure_updates += sent
        return sent

    # ------------------------------------------------------------------ controls

    def _say(self, text: str, error: bool = False) -> None:
        self._set(self.notice, value=_colored(text, ERROR_COLOR if error else "#555"))

    def _on_scale(self, _button: Any = None) -> None:
        self._disarm_stop()
        n = int(self.workers_input.value)
        self._in_background(
            f"scaling to {n} workers…",
            lambda: self.job.scale(n),
            lambda r: f"workers {r.get('workers_from', '?')} → {r.get('workers_to', n)}",
        )

    def _on_stop(self, _button: Any = None) -> None:
        now = time.monotonic()
        if self._stop_armed_at is None or now - self._stop_armed_at > CONFIRM_SECONDS:
            self._stop_armed_at = now
            self._set(self.stop_button, description="Confirm stop", button_style="danger")
            return
        self._disarm_stop()
        self._in_background(
            "stopping the job…",
            self.job.stop,
            lambda status: f"job {status.get('state', 'stopped')}",
        )

    def _disarm_stop(self) -> int:
        self._stop_armed_at = None
        return self._set(self.stop_button, description="Stop", button_style="warning")

    def _in_background(
        self, doing: str, action: Callable[[], Any], done: Callable[[Any], str]
    ) -> None:
        """Run a control action off the kernel's main thread (`job.stop()` may wait for
        seconds); its outcome, or its error, shows beside the buttons."""
        if self._action is not None and self._action.is_alive():
            self._say("still busy with the previous action", error=True)
            return
        self._say(doing)

        def run() -> None:
            try:
                self._say(done(action() or {}))
            except Exception as exc:
                self._say(str(exc) or repr(exc), error=True)

        self._action = threading.Thread(target=run, name="edl-dashboard-control", daemon=True)
        self._action.start()


# ---------------------------------------------------------------------- HTML


def _execution_count() -> int | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return getattr(ip, "execution_count", None)


def _colored(text: str, color: str) -> str:
    return f'<span style="color:{color}">{html.escape(text)}</span>'


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _status_html(view: JobView, now: float) -> str:
    """Header, progress bar and progress figures: the part that changes every render."""
    e = html.escape
    color = STATE_COLORS.get(view.state, "#555")
    head = [
        f"<b>{e(view.name)}</b>",
        f'<span style="color:#888">{e(view.backend)}</span>',
        f'<b style="color:{color}">{e(view.state)}</b>',
    ]
    if not view.ended and view.phase != "training":
        head.append(e(view.phase))
    elif not view.ended and view.evaluating is not None:
        head.append(f"evaluating (round {view.evaluating})")
    head.append(f"elapsed {_duration(view.elapsed(now))}")
    eta = view.eta(now)
    if eta is not None:
        head.append(f"ETA {_duration(eta)}")
    total, done = view.records_total(), view.records_done()
    fraction = min(1.0, done / total) if total else (1.0 if view.state == "succeeded" else 0.0)
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
    figures.append(f"workers {view.live_workers()}/{view.workers or '?'}")
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
        color = ERROR_COLOR if view.state == "failed" else "#555"
        reason = f"<div>{_colored(view.reason, color)}</div>"
    return (
        '<div style="font-size:13px;line-height:1.5">'
        f"<div>{' · '.join(head)}</div>{bar}<div>{figures_line}</div>{reason}</div>"
    )


_CHANGES = {"failure": "recovery", "joined": "join", "left": "leave"}


def _details_html(view: JobView) -> str:
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
        color = ERROR_COLOR if r.state in LOST else "inherit"
        values = (r.role, r.id, r.state, restarts, exit_, r.reason, r.pid or "")
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
        text = _colored(line.text, ERROR_COLOR) if line.error else e(line.text)
        lines.append(f'<div><span style="color:#888">{stamp}</span> {text}</div>')
    log = (
        '<div class="edl-events" style="max-height:180px;overflow-y:auto;display:flex;'
        "flex-direction:column-reverse;font-family:var(--jp-code-font-family,monospace);"
        'font-size:12px;border-top:1px solid #ddd;margin-top:6px;padding-top:4px">'
        + ("".join(lines) or '<div style="color:#888">no events yet</div>')
        + "</div>"
    )
    return table + log
