"""`Dashboard`: the live job dashboard in a notebook, ipywidgets plus a plotly FigureWidget.

Two daemon threads per dashboard, nothing shared between dashboards:

- the reader follows `job.events(follow=True)` from seq 0 and folds every event into a
  `JobView` (`elasticdl_nb.sdk.view`, the one fold every front end reads) under a lock;
  it never touches a widget;
- the renderer wakes every `interval` seconds and pushes what changed into widget traits.
  Only traits: never `print` or `with output:` from a thread, which would write into
  whichever cell happens to be running.

What the front end receives is kept to a few messages a second however fast events come
(about 4 at the defaults). A render sends one message per widget that changed, so
everything that changes often lives in few widgets: `status` (header, progress bar and
figures, one HTML widget, at most every `interval`), the curves (a `LiveFigure`,
live_figure.py: one message per update, at most every `figure_interval`; below them in
the same figure the workers over time with the faults and relaunches marked, redrawn
with the curves when they changed, and every `TIMELINE_EXTEND_S` to draw the line on to
now) and `details` (instances table and event log, one HTML widget, only when they
changed, at the same slower pace). Below them, set once, where the job's TensorBoard log
is and the lines that show it (`tensorboard`). Their HTML is drawn by dashboard_html.py.
Controls: a worker count N or range MIN:MAX with "Scale" (checked before it is sent), and
"Stop", which asks for a second click first.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from elasticdl_nb.sdk.view import JobLike, JobView
from elasticdl_nb.sdk.view.timeline import (
    MARK_KINDS,
    MASTER_LOST,
    PS_LOST,
    RELAUNCH,
    STRAGGLER,
    WORKER_LOST,
)
from elasticdl_nb.spec import SpecError, worker_range
from elasticdl_nb.vocabulary import JobState
from elasticdl_nb.widgets.dashboard_html import (
    ERROR_COLOR,
    WARNING_COLOR,
    colored,
    details_html,
    status_html,
    tensorboard_html,
)
from elasticdl_nb.widgets.live_figure import LiveFigure

CONFIRM_SECONDS = 5.0  # "Confirm stop" turns back into "Stop" after this long
TRAINING_LOSS = "training loss"
TIMELINE_EXTEND_S = 10.0  # a running job's workers line is drawn on to now this often
MARK_STYLES = {
    WORKER_LOST: {"symbol": "x", "color": ERROR_COLOR, "size": 10},
    PS_LOST: {"symbol": "diamond", "color": ERROR_COLOR, "size": 10},
    MASTER_LOST: {"symbol": "star", "color": "#6a1b9a", "size": 12},
    RELAUNCH: {"symbol": "triangle-up", "color": "#1a7f37", "size": 9},
    STRAGGLER: {"symbol": "circle-open", "color": WARNING_COLOR, "size": 11},
}


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
        self._timeline_drawn = (-1, float("-inf"))  # (Timeline.version, monotonic time)
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
        # A number N or a range MIN:MAX, checked on Scale; it follows the job's own
        # (`workers_text`) until someone types another.
        self._workers_shown = self.view.workers_text()
        self.workers_input = W.Text(
            value=self._workers_shown,
            placeholder="N or MIN:MAX",
            description="workers",
            layout=W.Layout(width="150px"),
        )
        self.scale_button = W.Button(
            description="Scale", tooltip="set the number of workers: N, or a range MIN:MAX"
        )
        self.stop_button = W.Button(
            description="Stop", button_style="warning", tooltip="stop the job"
        )
        self.scale_button.on_click(self._on_scale)
        self.stop_button.on_click(self._on_stop)
        # One figure, two charts: the curves over steps (top: losses, the evaluation's
        # too, on the left axis; the other evaluation metrics on their own right axis,
        # shown once there is one) and the workers over time with their marks (bottom):
        # one message updates both.
        self.figure = LiveFigure(
            data=[
                go.Scatter(x=[], y=[], mode="lines", name=TRAINING_LOSS),
                go.Scatter(x=[], y=[], mode="lines", name="live workers", line={"shape": "hv"},
                           xaxis="x2", yaxis="y3", legend="legend2"),
                go.Scatter(x=[], y=[], mode="lines", name="desired workers", xaxis="x2",
                           yaxis="y3", legend="legend2",
                           line={"shape": "hv", "dash": "dot", "color": "#888"}),
                go.Scatter(x=[], y=[], mode="lines", name="pending workers", xaxis="x2",
                           yaxis="y3", legend="legend2",
                           line={"shape": "hv", "dash": "dash", "color": "#d62728"}),
                *[
                    go.Scatter(x=[], y=[], text=[], mode="markers", name=kind,
                               marker=MARK_STYLES[kind], hoverinfo="text+x", xaxis="x2",
                               yaxis="y3", legend="legend2")
                    for kind in MARK_KINDS
                ],
            ],
            layout=go.Layout(
                height=470,
                margin={"l": 55, "r": 55, "t": 30, "b": 70},
                xaxis={"title": {"text": "step"}, "anchor": "y"},
                yaxis={"title": {"text": "loss"}, "domain": [0.45, 1]},
                yaxis2={
                    "title": {"text": "evaluation metrics"},
                    "overlaying": "y",
                    "side": "right",
                    "showgrid": False,
                    "tickformat": ".3~g",
                    "nticks": 6,
                    "visible": False,
                },
                xaxis2={"title": {"text": "seconds since the start"}, "anchor": "y3",
                        "rangemode": "tozero"},
                yaxis3={"title": {"text": "workers"}, "domain": [0, 0.27],
                        "rangemode": "tozero", "dtick": 1},
                legend={"orientation": "h", "y": 1.12},
                legend2={"orientation": "h", "y": -0.2, "yanchor": "top"},
                template="plotly_white",
            ),
        )  # fmt: skip
        self._traces[TRAINING_LOSS] = 0
        self._controls = W.HBox(
            [self.workers_input, self.scale_button, self.stop_button, self.notice]
        )
        # (set once: where the job's TensorBoard log is)
        self.tensorboard = W.HTML(value=tensorboard_html(self.view))
        self.widget = W.VBox(
            [self.status, self._controls, self.figure, self.details, self.tensorboard]
        )

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
        details = timeline = None
        with self._view_lock:
            view = self.view
            status = status_html(view, time.time())
            ended = view.ended
            workers = view.workers_text()
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
                    details = details_html(view)
                    self._details_drawn = versions
                drawn, drawn_at = self._timeline_drawn
                version = view.timeline.version
                stale = not ended and now - drawn_at >= TIMELINE_EXTEND_S
                if version and (version != drawn or stale or final):
                    timeline = view.timeline.traces(view.elapsed(time.time()))
                    self._timeline_drawn = (version, now)
        sent = 0
        with self._push_lock:
            sent += self._set(self.status, value=status)
            sent += self._follow_workers(workers)
            if details is not None:
                sent += self._set(self.details, value=details)
            if curves or timeline:
                sent += self._draw(curves, timeline)
            if self._stop_armed_at is not None and now - self._stop_armed_at > CONFIRM_SECONDS:
                sent += self._disarm_stop()
            if ended:  # (a stream that broke off early leaves the controls usable)
                sent += self._disable_controls()
            if final and self.error:
                sent += self._set(self.notice, value=colored(self.error, ERROR_COLOR))
            if sent:
                self.renders += 1
        return sent

    def _follow_workers(self, workers: str) -> int:
        """Show the job's workers (after a scale from elsewhere too) in the workers box,
        unless it holds something else that someone typed."""
        if workers == self._workers_shown:
            return 0
        typed = self.workers_input.value.strip() not in ("", self._workers_shown)
        self._workers_shown = workers
        return 0 if typed else self._set(self.workers_input, value=workers)

    def _disable_controls(self) -> int:
        """A job that has ended can be neither scaled nor stopped: its controls are greyed
        out, the Stop button without its warning colour."""
        sent = self._set(self.workers_input, disabled=True)
        sent += self._set(self.scale_button, disabled=True)
        self._stop_armed_at = None
        return sent + self._set(
            self.stop_button, disabled=True, description="Stop", button_style=""
        )

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

    def _draw(
        self,
        curves: dict[str, tuple[list[float], list[float]]],
        timeline: list[dict[str, list]] | None = None,
    ) -> int:
        """Update the curves (a new evaluation metric gets a trace: `metric_axis`) and
        the workers over time (`Timeline.traces`, for the traces after the loss)."""
        fig, sent = self.figure, 0
        new = [name for name in curves if name not in self._traces]
        if new:
            fig.add_traces(
                [
                    go.Scatter(
                        x=curves[n][0], y=curves[n][1], name=n, mode="lines+markers",
                        yaxis=metric_axis(n),
                    )
                    for n in new
                ]
            )  # fmt: skip
            for n in new:
                self._traces[n] = len(fig.data) - len(new) + new.index(n)
            sent += 1
        # (once: the right axis shows with the first metric of its own)
        show_axis = not fig.layout.yaxis2.visible and any(metric_axis(n) == "y2" for n in new)
        old = {n: xy for n, xy in curves.items() if n not in new}
        if old or timeline or show_axis:
            with fig.batch_update():
                if show_axis:
                    fig.layout.yaxis2.visible = True
                for name, (xs, ys) in old.items():
                    trace = fig.data[self._traces[name]]
                    trace.x, trace.y = xs, ys
                for trace, drawn in zip(fig.data[1 : 1 + len(timeline or [])], timeline or []):
                    trace.x, trace.y = drawn["x"], drawn["y"]
                    if "text" in drawn:
                        trace.text = drawn["text"]
                if timeline:  # whole workers on the axis, about four ticks
                    most = max((y for drawn in timeline for y in drawn["y"]), default=1)
                    fig.layout.yaxis3.dtick = max(1, math.ceil(most / 4))
            sent += 1
        self.messages += sent
        self.figure_updates += sent
        return sent

    # ------------------------------------------------------------------ controls

    def _say(self, text: str, error: bool = False) -> None:
        self._set(self.notice, value=colored(text, ERROR_COLOR if error else "#555"))

    def _on_scale(self, _button: Any = None) -> None:
        self._disarm_stop()
        text = self.workers_input.value.strip()
        problem = scale_problem(text)
        if problem:
            self._say(problem, error=True)
            return
        self._in_background(
            f"scaling to {text} workers…",
            lambda: self.job.scale(text),
            lambda r: f"workers {r.get('workers_from', '?')} → {scaled_to(r, text)}",
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
            lambda status: f"job {status.get('state', JobState.STOPPED)}",
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


def scale_problem(text: str) -> str:
    """Why `text` cannot be given to `job.scale` ('' when it can): a number of workers
    N >= 1 or a range MIN:MAX with 1 <= MIN <= MAX."""
    try:
        _low, high = worker_range(text)
    except SpecError as exc:
        return str(exc)
    if not isinstance(high, int) or high < 1:
        return f"workers={text!r}: give N >= 1 (e.g. 3) or a range MIN:MAX (e.g. 2:6)."
    return ""


def scaled_to(result: dict, asked: str) -> str:
    """What a scale's answer says the job now asks for: '5', or the range '2:5'."""
    if "workers_to" not in result:
        return asked
    low = result.get("min_workers") or 0
    return f"{low}:{result['workers_to']}" if low else str(result["workers_to"])


def metric_axis(curve: str) -> str:
    """The axis of a curve: losses (the training loss, an evaluation's loss) share the
    left one, where they can be compared; any other metric (accuracy, AUC: another scale)
    goes on the right."""
    return "y" if curve == TRAINING_LOSS or curve.endswith("loss") else "y2"


def _execution_count() -> int | None:
    """The running cell's number in IPython, or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return getattr(ip, "execution_count", None)
