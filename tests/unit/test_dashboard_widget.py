"""The live dashboard's widgets, driven by a fake job whose events() yields from a list.

What the front end would receive is counted at the widgets' comms: without a kernel,
ipywidgets gives every widget a `comm.DummyComm`, whose `publish_msg` is wrapped here.
"""

import io
import threading
import time
from collections import Counter

import comm
import plotly.graph_objects as go
import pytest

from elasticdl_nb.runtime.master.journal import Event
from elasticdl_nb.spec import JobSpec, worker_range
from elasticdl_nb.widgets import show, widget_frontend_available
from elasticdl_nb.widgets.dashboard import Dashboard
from elasticdl_nb.widgets.live_figure import LiveFigure

CODE = 'style="font-family:var(--jp-code-font-family,monospace)"'


class FakeJob:
    """name, dir (with spec.json), events(), scale(), stop(): what Dashboard uses."""

    def __init__(
        self, tmp_path, name, events, pause_every=0, pause=0.0, fail_after=None, tensorboard=True
    ):
        self.name = name
        self.dir = tmp_path / name
        self.dir.mkdir()
        spec = JobSpec.from_options(
            data=["train.csv"], epochs=2, workers=2, ps=1, tensorboard=tensorboard
        )
        (self.dir / "spec.json").write_text(spec.to_json())
        self._events = events
        self.pause_every, self.pause, self.fail_after = pause_every, pause, fail_after
        self.calls: list[tuple] = []
        self.scale_error: Exception | None = None

    def events(self, from_seq=0, follow=True, timeout=None):
        for i, event in enumerate(self._events[from_seq:]):
            if self.fail_after is not None and i == self.fail_after:
                raise ConnectionError("master unreachable")
            if self.pause_every and i % self.pause_every == 0:
                time.sleep(self.pause)
            yield event
        self.fed_until = time.monotonic()

    def scale(self, workers):
        self.calls.append(("scale", workers))
        if self.scale_error:
            raise self.scale_error
        low, high = worker_range(workers)  # as Job.scale, and the master's answer
        return {"workers_from": 2, "workers_to": high, **({"min_workers": low} if low else {})}

    def stop(self):
        self.calls.append(("stop",))
        return {"state": "stopped"}


def training_events(n_loss: int, state: str = "succeeded", points_per_event: int = 1):
    """A two-epoch job: `n_loss` loss events, progress every 50, two evaluations."""
    out: list[Event] = []

    def add(kind, /, **data):
        out.append(Event(len(out), 1000.0 + 0.001 * len(out), kind, data))

    def prog(epoch, done):
        return dict(
            epoch=epoch,
            epochs=2,
            step=len(out),
            records_done=done,
            records_per_epoch=n_loss,
            records_per_second=500.0,
        )

    add("job_state", state="running", reason="started", **prog(0, 0))
    add("instance", role="ps", id=0, kind="started", pid=10)
    for w in (0, 1):
        add("instance", role="worker", id=w, kind="started", pid=20 + w)
    step = 0
    for epoch in (0, 1):
        add("epoch", epoch=epoch, tasks=n_loss // 100)
        for i in range(n_loss // 2):
            pts = [[step + k + 1, 1.0 / (step + k + 1)] for k in range(points_per_event)]
            step += points_per_event
            add("loss", worker=i % 2, points=pts)
            if i % 50 == 49:
                add("progress", **prog(epoch, 2 * (i + 1)))
        add(
            "evaluation",
            round=epoch,
            step=step,
            # The master's evaluations report a loss too: it must not replace the
            # training loss on the figure.
            metrics={"accuracy": 0.5 + epoch / 4, "loss": 2.0 - epoch},
            final=epoch == 1,
        )
    add("job_state", state=state, reason="all epochs done", **prog(1, n_loss))
    return out


@pytest.fixture
def sent(monkeypatch):
    """Every message the widgets publish, as (comm_id, msg_type, data, monotonic time)."""
    log: list[tuple[str, str, dict, float]] = []
    lock = threading.Lock()

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        with lock:
            log.append((self.comm_id, msg_type, data, time.monotonic()))

    monkeypatch.setattr(comm.DummyComm, "publish_msg", publish_msg)
    return log


def updates_to(log, widget) -> int:
    return sum(1 for c, kind, *_ in log if c == widget.model_id and kind == "comm_msg")


def test_the_widgets_end_with_the_final_state(tmp_path, sent):
    job = FakeJob(tmp_path, "final", training_events(2000), pause_every=200, pause=0.01)
    dash = Dashboard(job, loss_points=256)
    assert dash.join(10), "the dashboard did not finish"
    assert dash.error is None
    status = dash.status.value
    assert ">succeeded<" in status and "all epochs done" in status
    assert "epoch 2/2 | 2000/2000 records (100%)" in status and "width:100.0%" in status
    assert "workers 2/2" in status and "PS 1" in status
    details = dash.details.value
    assert details.count("<tr") == 4  # header, ps 0, workers 0 and 1
    assert "evaluation at step 2000: accuracy 0.7500" in details
    assert "job succeeded: all epochs done" in details
    loss, accuracy, eval_loss = (t for t in dash.figure.data if t.xaxis in (None, "x"))
    assert (loss.name, accuracy.name, eval_loss.name) == (
        "training loss",
        "eval accuracy",
        "eval loss",
    )
    # losses share the left axis; accuracy (another scale) has the right one to itself,
    # shown once it has a curve, with short tick labels
    assert loss.yaxis in (None, "y") and eval_loss.yaxis == "y" and accuracy.yaxis == "y2"
    axis = dash.figure.layout.yaxis2
    assert axis.visible and axis.tickformat == ".3~g" and axis.title.text == "evaluation metrics"
    assert 256 < len(loss.x) <= 2 * 256 and loss.x[-1] == 2000 and loss.y[-1] == 1 / 2000
    assert list(accuracy.x) == [1000, 2000] and list(accuracy.y) == [0.5, 0.75]
    assert list(eval_loss.x) == [1000, 2000] and list(eval_loss.y) == [2.0, 1.0]
    assert (dash.scale_button.disabled, dash.stop_button.disabled) == (True, True)
    # what the front end got for the figure: one message per update (and three that
    # plotly sends when the figure is built)
    assert updates_to(sent, dash.figure) == dash.figure_updates + 3
    # the evaluation traces added; loss and evaluations updated, the right axis shown
    assert dash.figure_updates == 2
    # where its TensorBoard log is, and the lines that show it in a notebook
    logdir = job.dir / "tensorboard"
    assert f"TensorBoard log: <code {CODE}>{logdir}</code>" in dash.tensorboard.value
    assert f"%tensorboard --logdir {logdir}</code>" in dash.tensorboard.value
    assert "%load_ext tensorboard" in dash.tensorboard.value


def test_a_job_that_ended_has_its_controls_disabled_while_its_stream_is_still_open(tmp_path, sent):
    # The journal's stream stays open a moment after the job's end (the master finishing
    # up): the controls must not look usable meanwhile.
    stream_open = threading.Event()

    class OpenEndedJob(FakeJob):
        def events(self, from_seq=0, follow=True, timeout=None):
            yield from super().events(from_seq, follow, timeout)
            stream_open.set()
            time.sleep(30)  # (a daemon thread: the test does not wait for it)

    job = OpenEndedJob(tmp_path, "ended", training_events(100))
    dash = Dashboard(job, interval=60)  # (no render of its own: the test renders)
    assert stream_open.wait(10)
    assert not dash.stop_button.disabled, "a control was disabled before any render"
    dash.render()
    assert dash.view.ended
    assert dash.workers_input.disabled and dash.scale_button.disabled
    assert dash.stop_button.disabled and dash.stop_button.button_style == ""
    dash._closed = True


def test_a_job_that_writes_no_tensorboard_log_shows_no_link_to_one(tmp_path, sent):
    job = FakeJob(tmp_path, "no-tb", training_events(10), tensorboard=False)
    dash = Dashboard(job)
    assert dash.join(5)
    assert dash.tensorboard.value == "" and "tensorboard" not in dash.details.value


def test_renders_and_messages_are_throttled(tmp_path, sent):
    # 5000 events fed in about a second
    job = FakeJob(tmp_path, "fast", training_events(4900), pause_every=50, pause=0.01)
    dash = Dashboard(job)
    started = time.monotonic()  # the first render is done, the feed starts
    assert dash.join(10)
    seconds = job.fed_until - started
    assert 0.8 < seconds < 3, seconds
    assert dash.view.last_seq == len(job._events) - 1
    # the first (empty) render, at most 2 a second, and the final one
    assert 3 <= dash.renders <= 2 * seconds + 2, (dash.renders, seconds)
    widgets = (
        dash.status,
        dash.details,
        dash.figure,
        dash.notice,
        dash.workers_input,
        dash.scale_button,
        dash.stop_button,
    )
    ours = [(kind, t) for c, kind, _, t in sent if c in {w.model_id for w in widgets}]
    messages = [t for kind, t in ours if kind == "comm_msg"]
    assert len(messages) - 3 == dash.messages  # less the figure's three when it was built
    during_feed = [t for t in messages if started <= t <= job.fed_until]
    assert 2 <= len(during_feed) <= 4 * seconds + 1, (len(during_feed), seconds)


def test_the_loss_trace_stays_bounded(tmp_path, sent):
    job = FakeJob(tmp_path, "long", training_events(2000, points_per_event=20))
    dash = Dashboard(job, loss_points=128)
    assert dash.join(10)
    assert dash.view.loss.count == 40_000
    xs, ys = dash.figure.data[0].x, dash.figure.data[0].y
    assert len(xs) == len(ys) <= 256
    assert xs[-1] == 40_000 and min(ys) == 1 / 40_000 and max(ys) == 1.0


def test_scale_and_stop_buttons_call_the_job(tmp_path, sent):
    job = FakeJob(tmp_path, "ctl", training_events(100, state="running"))
    dash = Dashboard(job)
    assert dash.join(5)  # the events end without a terminal state: the job still runs
    assert not dash.scale_button.disabled

    def settle():
        dash._action.join(5)

    assert dash.workers_input.value == "2"  # the job's own, as the view says it
    dash.workers_input.value = "5"
    dash.scale_button.click()
    settle()
    assert job.calls == [("scale", "5")]
    assert "workers 2 → 5" in dash.notice.value

    # A range: the text goes to job.scale as it is, the answer names the range.
    dash.workers_input.value = " 2:6 "
    dash.scale_button.click()
    settle()
    assert job.calls == [("scale", "5"), ("scale", "2:6")]
    assert "workers 2 → 2:6" in dash.notice.value and "#c62828" not in dash.notice.value

    # What is not a number of workers nor a range is refused here, as an error beside
    # the buttons (no traceback, no call to the job).
    for bad, why in [
        ("6:2", "a range needs 1 &lt;= MIN &lt;= MAX"),
        ("0:3", "a range needs 1 &lt;= MIN &lt;= MAX"),
        ("two", "is not a number of workers"),
        ("2:", "is not a number of workers"),
        ("0", "give N &gt;= 1"),
        ("", "give N &gt;= 1"),
    ]:
        dash.workers_input.value = bad
        dash.scale_button.click()
        assert dash._action is None or not dash._action.is_alive()
        assert why in dash.notice.value and "#c62828" in dash.notice.value, (bad, dash.notice)
    assert job.calls == [("scale", "5"), ("scale", "2:6")]

    dash.stop_button.click()  # the first click only asks for confirmation
    assert job.calls == [("scale", "5"), ("scale", "2:6")]
    assert dash.stop_button.description == "Confirm stop"
    dash.stop_button.click()
    settle()
    assert job.calls == [("scale", "5"), ("scale", "2:6"), ("stop",)]
    assert dash.stop_button.description == "Stop" and "job stopped" in dash.notice.value

    job.scale_error = ValueError("Cannot scale job 'ctl': it is succeeded")
    dash.workers_input.value = "3"
    dash.scale_button.click()
    settle()
    assert "Cannot scale job &#x27;ctl&#x27;: it is succeeded" in dash.notice.value
    assert "#c62828" in dash.notice.value  # shown as an error


def test_the_workers_box_follows_the_job_unless_someone_typed_in_it(tmp_path, sent):
    events = training_events(100, state="running")
    job = FakeJob(tmp_path, "follow", events[:-1])
    dash = Dashboard(job, interval=60)  # (no render of its own: the test renders)
    assert dash.join(5)
    dash.render()
    assert dash.workers_input.value == "2"

    def scaled(low, high):  # a scale from elsewhere (the sidebar, %elasticdl scale)
        data = dict(workers_from=2, workers_to=high, reason="requested", min_workers=low)
        dash.view.apply(Event(dash.view.last_seq + 1, 2000.0, "scale", data))
        dash.render()

    scaled(2, 4)
    assert dash.workers_input.value == "2:4"
    dash.workers_input.value = "3"  # someone is choosing
    scaled(2, 5)
    assert dash.workers_input.value == "3"
    dash.workers_input.value = "2:5"  # back to the job's own: it follows again
    scaled(0, 6)
    assert dash.workers_input.value == "6"
    dash._closed = True


def test_an_error_in_the_event_thread_shows_in_the_widget(tmp_path, sent):
    job = FakeJob(tmp_path, "broken", training_events(200, state="running"), fail_after=50)
    dash = Dashboard(job)
    assert dash.join(5)
    assert dash.error == "stopped following the job's events: ConnectionError('master unreachable')"
    assert "master unreachable" in dash.notice.value and "#c62828" in dash.notice.value
    assert "master unreachable" in dash.details.value
    assert dash.view.last_seq == 49


def test_dashboards_of_two_jobs_side_by_side(tmp_path, sent):
    a = FakeJob(tmp_path, "job-a", training_events(1000), pause_every=100, pause=0.01)
    b = FakeJob(
        tmp_path, "job-b", training_events(600, state="failed"), pause_every=100, pause=0.01
    )
    da, db = Dashboard(a), Dashboard(b)
    assert da.join(10) and db.join(10)
    assert "<b>job-a</b>" in da.status.value and ">succeeded<" in da.status.value
    assert "<b>job-b</b>" in db.status.value and ">failed<" in db.status.value
    assert da.figure.data[0].x[-1] == 1000 and db.figure.data[0].x[-1] == 600
    assert da.status.model_id != db.status.model_id


def test_one_message_per_figure_update_and_no_echo_of_the_browsers_replies(sent):
    def count(fig, action):
        before = updates_to(sent, fig)
        action()
        return updates_to(sent, fig) - before

    def update(fig):
        with fig.batch_update():
            fig.data[0].x, fig.data[0].y = [1, 2, 3], [3, 1, 2]

    # What the browser sends back after applying an update
    reply = {
        "method": "update",
        "buffer_paths": [],
        "state": {
            "_js2py_traceDeltas": {"trace_edit_id": 1, "trace_deltas": []},
            "_js2py_layoutDelta": {"layout_edit_id": 1, "layout_delta": {}},
        },
    }
    stock = go.FigureWidget(data=[go.Scatter(x=[], y=[])])
    live = LiveFigure(data=[go.Scatter(x=[], y=[])])
    assert count(stock, lambda: update(stock)) == 4  # what plotly does
    assert count(live, lambda: update(live)) == 1
    assert count(live, lambda: live.add_scatter(x=[1], y=[2])) == 1
    assert list(live.data[0].x) == [1, 2, 3]
    payload = [d for c, k, d, _ in sent if c == live.model_id and k == "comm_msg"][-2]["state"]
    assert payload["_py2js_update"]["trace_edit_id"] == payload["_last_trace_edit_id"]
    assert count(stock, lambda: stock._handle_msg({"content": {"data": reply}, "buffers": []})) >= 2
    assert count(live, lambda: live._handle_msg({"content": {"data": reply}, "buffers": []})) == 0


def test_show_prints_text_where_no_widgets_can_be_drawn(tmp_path):
    assert not widget_frontend_available()
    job = FakeJob(tmp_path, "txt", training_events(100, state="failed"))
    out = io.StringIO()
    assert show(job, out=out) is None
    for _ in range(100):
        if "job failed" in out.getvalue():
            break
        time.sleep(0.05)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[txt] job started"
    assert lines[1].startswith("[txt] epoch 1/2 | 100/100 records (100%)")
    assert lines[-1] == "[txt] job failed: all epochs done"


def test_show_can_be_forced_to_draw_widgets(tmp_path, sent):
    job = FakeJob(tmp_path, "forced", training_events(100))
    dash = show(job, text=False)
    assert isinstance(dash, Dashboard) and dash.join(5)
    kinds = Counter(kind for _, kind, *_ in sent)
    assert kinds["comm_open"] >= 5
