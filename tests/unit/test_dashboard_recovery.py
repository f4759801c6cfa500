"""What the dashboard and the text progress show of faults and recovery, from a synthetic
journal: the master's goodput in the header, the workers over time with the faults and
relaunches marked, a straggler in the table, the log and the progress line, and a master
restart."""

from __future__ import annotations

import io

from elasticdl_nb.runtime.master.journal import Event
from elasticdl_nb.sdk.progress import ProgressPrinter
from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.sdk.view.timeline import MASTER_LOST, PS_LOST, RELAUNCH, STRAGGLER, WORKER_LOST
from elasticdl_nb.widgets.dashboard_html import details_html, status_html

T0 = 1_700_000_000.0


def progress(step, goodput, recovering=0.0):
    return dict(epoch=0, epochs=2, step=step, records_done=10 * step, records_per_epoch=1000,
                records_per_second=100.0, goodput=goodput, training_s=30.0 * step,
                recovering_s=recovering)  # fmt: skip


def a_job_with_faults() -> list[Event]:
    """3 workers and a PS; worker 1 killed at 20 s and replaced by worker 3; worker 2 a
    straggler from 30 s; the PS lost at 40 s; the master restarted at 50 s."""
    out: list[Event] = []

    def at(t, kind, /, **data):
        out.append(Event(len(out), T0 + t, kind, data))

    at(0, "job_state", state="running", reason="started", **progress(0, None))
    at(0, "scale", workers_from=0, workers_to=3, reason="job start")
    at(1, "instance", role="ps", id=0, kind="started", pid=10)
    for w in range(3):
        at(1, "instance", role="worker", id=w, kind="started", pid=20 + w)
    at(10, "progress", **progress(1, 1.0))
    at(20, "instance", role="worker", id=1, kind="killed", signal="SIGKILL",
       reason="killed by SIGKILL", expected=False)  # fmt: skip
    at(20, "relaunch", role="worker", id=3, replaces=1, reason="killed by SIGKILL")
    at(21, "instance", role="worker", id=3, kind="started", pid=23)
    at(30, "straggler", worker=2, step_s=0.21, median_s=0.05, ratio=4.2, lagging_s=8.0)
    at(31, "progress", **progress(2, 0.8765, recovering=9.5))
    at(40, "instance", role="ps", id=0, kind="killed", reason="killed by SIGKILL",
       expected=False)  # fmt: skip
    at(40, "relaunch", role="ps", id=0, replaces=0, reason="killed by SIGKILL")
    at(44, "instance", role="ps", id=0, kind="started", pid=11)
    at(50, "master_restarted", incarnation=1, pid=99, replayed=16, rebuild_s=0.2,
       down_s=3.0, adopted=4)  # fmt: skip
    at(55, "progress", **progress(3, 0.8123, recovering=30.0))
    return out


def view_of(events) -> JobView:
    view = JobView("faulty", backend="local", epochs=2, workers=3, ps=1)
    for event in events:
        view.apply(event)
    return view


def test_the_header_shows_the_master_s_goodput_and_its_restarts():
    view = view_of(a_job_with_faults())
    assert view.goodput() == 0.8123 and view.master_restarts == 1
    status = status_html(view, T0 + 60)
    assert "goodput 81 % (30 of 120 worker-s recovering)" in status
    assert "master restarted 1×" in status
    assert "workers 3/3" in status
    assert "straggler: worker 2 (4.2× median)" in status


def test_the_workers_over_time_with_the_faults_and_relaunches_marked():
    view = view_of(a_job_with_faults())
    live_x, live_y = view.timeline.live.xy()
    assert list(zip(live_x, live_y)) == [(0, 0), (1, 1), (1, 2), (1, 3), (20, 2), (21, 3)]
    assert view.timeline.desired.xy() == ([0], [3])
    marks = [(m.at, m.kind, m.text, m.workers) for m in view.timeline.marks]
    assert marks == [
        (20, WORKER_LOST, "worker 1 killed by SIGKILL", 2),
        (20, RELAUNCH, "worker 3 relaunched (replacing 1)", 2),
        (30, STRAGGLER, "worker 2 a straggler (4.2× median)", 3),
        (40, PS_LOST, "ps 0 killed by SIGKILL", 3),
        (40, RELAUNCH, "ps 0 relaunched (replacing 0)", 3),
        (50, MASTER_LOST, "master restarted (#1), down 3.0 s", 3),
    ]


def test_a_straggler_is_marked_in_the_table_and_the_log_until_it_ends():
    events = a_job_with_faults()
    view = view_of(events)
    details = details_html(view)
    row = next(r for r in details.split("<tr") if "<td" in r and ">22<" in r)  # worker 2
    assert "running" not in row and "started, straggler (4.2× median)" in row
    assert "#b35c00" in row  # the straggler's color
    assert (
        "worker 2 is a straggler: 0.21 s per minibatch, 4.2× the median of the others "
        "(0.05 s) for 8 s" in details
    )
    ended = Event(len(events), T0 + 60, "instance", {"role": "worker", "id": 2,
                  "kind": "killed", "expected": False, "reason": "killed by SIGKILL"})  # fmt: skip
    view.apply(ended)
    assert view.stragglers == {} and "straggler (" not in details_html(view)
    view_cleared = view_of(
        [
            *events,
            Event(len(events), T0 + 60, "straggler_cleared", {"worker": 2, "reason": "caught up"}),
        ]  # fmt: skip
    )
    assert view_cleared.stragglers == {}
    assert "worker 2 is no longer a straggler (caught up)" in details_html(view_cleared)


def test_the_dashboard_figure_draws_the_timeline_below_the_curves(tmp_path):
    from elasticdl_nb.widgets.dashboard import Dashboard
    from tests.unit.test_dashboard_widget import FakeJob

    events = a_job_with_faults()
    events.append(Event(len(events), T0 + 70, "job_state", {"state": "succeeded",
                        "reason": "all epochs done", **progress(4, 0.8)}))  # fmt: skip
    dash = Dashboard(FakeJob(tmp_path, "faulty", events))
    assert dash.join(10)
    traces = {t.name: t for t in dash.figure.data}
    live = traces["live workers"]
    assert (live.xaxis, live.yaxis) == ("x2", "y3")
    assert list(live.x) == [0, 1, 1, 1, 20, 21, 70] and list(live.y) == [0, 1, 2, 3, 2, 3, 3]
    assert list(traces["desired workers"].x) == [0, 70]  # drawn on to the end
    assert list(traces[WORKER_LOST].x) == [20] and list(traces[RELAUNCH].x) == [20, 40]
    assert list(traces[PS_LOST].text) == ["ps 0 killed by SIGKILL"]
    assert list(traces[MASTER_LOST].x) == [50] and list(traces[STRAGGLER].y) == [3]
    assert dash.figure.layout.yaxis3.dtick == 1  # whole workers
    assert "goodput 80 %" in dash.status.value


def test_the_text_progress_line_says_goodput_workers_and_the_straggler():
    out = io.StringIO()
    printer = ProgressPrinter("faulty", out, every_seconds=0)
    for event in a_job_with_faults():
        printer.show(event)
    lines = out.getvalue().splitlines()
    assert (
        "[faulty] epoch 1/2 | 20/1000 records (2%) | step 2 | 100 rec/s | goodput 0.88 | "
        "workers 3/3 | straggler: worker 2 (4.2× median)"
    ) in lines
    assert lines[-1] == (
        "[faulty] epoch 1/2 | 30/1000 records (3%) | step 3 | 100 rec/s | goodput 0.81 | "
        "workers 3/3 | straggler: worker 2 (4.2× median)"
    )
    assert "[faulty] worker 2 is a straggler: 0.21 s per minibatch, 4.2× the median of the " in (
        out.getvalue()
    )
