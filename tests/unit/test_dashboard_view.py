"""The dashboard's state model (JobView) and its downsampled loss series, from synthetic
journal events: no widgets, no jobs."""

import math
import random
import time

import pytest

from elasticdl_nb.runtime.master.journal import Event
from elasticdl_nb.sdk.view import JobView, Series
from elasticdl_nb.sdk.view.text import describe

T0 = 1_700_000_000.0


class Events:
    """Builds a journal: numbered events, 10 ms apart unless `at` is given."""

    def __init__(self):
        self.list: list[Event] = []

    def __call__(self, kind: str, /, at: float | None = None, **data) -> Event:
        when = T0 + 0.01 * len(self.list) if at is None else at
        event = Event(len(self.list), when, kind, data)
        self.list.append(event)
        return event


def progress(epoch, done, per_epoch=1000, rate=50.0, epochs=3, step=0):
    return dict(
        epoch=epoch,
        epochs=epochs,
        step=step,
        records_done=done,
        records_per_epoch=per_epoch,
        records_per_second=rate,
    )


def eventful_job() -> list[Event]:
    """A job with every kind of event: a worker and the PS killed and relaunched,
    scaling, re-queued work, evaluations, two epochs, success."""
    ev = Events()
    ev("job_state", state="running", reason="started", **progress(0, 0, rate=0.0))
    ev("instance", role="ps", id=0, kind="started", pid=100)
    ev("scale", workers_from=0, workers_to=2, reason="job start")
    for w in (0, 1):
        ev("instance", role="worker", id=w, kind="started", pid=200 + w)
    ev("instance", role="ps", id=0, kind="running", restored_version=-1)
    ev("epoch", epoch=0, tasks=4)
    n = 0
    for task in range(4):
        ev("loss", worker=task % 2, points=[[n + i + 1, 2.0 / (n + i + 1)] for i in range(5)])
        n += 5
        ev("progress", **progress(0, 250 * (task + 1), step=n))
        if task == 1:
            ev(
                "instance",
                role="worker",
                id=1,
                kind="killed",
                signal="SIGKILL",
                reason="killed by SIGKILL",
                pid=201,
                expected=False,
            )
            ev("requeue", worker=1, task=7, kind="training", batches=3, epoch=0)
            ev("relaunch", role="worker", id=2, replaces=1, reason="killed by SIGKILL")
            ev("instance", role="worker", id=2, kind="started", pid=202)
    ev("evaluation_started", round=0, step=n, tasks=1)
    ev("evaluation", round=0, step=n, metrics={"accuracy": 0.5, "auc": 0.6}, final=False)
    ev("epoch", epoch=1, tasks=4)
    ev(
        "instance",
        role="ps",
        id=0,
        kind="failed",
        exit_code=1,
        reason="exit code 1",
        pid=100,
        expected=False,
    )
    ev("relaunch", role="ps", id=0, replaces=0, reason="exit code 1")
    ev("instance", role="ps", id=0, kind="started", pid=101)
    ev("ps_restored", ps=0, restored_version=10, newest_seen_version=12, updates_rolled_back=2)
    ev("scale", workers_from=2, workers_to=1, reason="requested")
    ev("instance", role="worker", id=2, kind="retiring")
    ev("instance", role="worker", id=2, kind="succeeded", exit_code=0, pid=202, expected=True)
    for task in range(4):
        ev("loss", worker=0, points=[[n + 1, 1.0 / (n + 1)]])
        n += 1
        ev("progress", **progress(1, 250 * (task + 1), step=n))
    ev("evaluation", round=1, step=n, metrics={"accuracy": 0.75, "auc": 0.8}, final=True)
    ev("phase", phase="exporting")
    ev("export", path="/x/model.keras", worker=0)
    ev("checkpoint", versions=[20], final=True)
    ev("job_state", state="succeeded", reason="all epochs done", **progress(1, 1000, step=n))
    return ev.list


# ---------------------------------------------------------------------- Series


def test_series_is_exact_until_its_buckets_are_full():
    s = Series(capacity=8)
    points = [(i, (i * 7) % 5) for i in range(7)]
    s.extend(points)
    assert s.xy() == ([p[0] for p in points], [float(p[1]) for p in points])
    assert s.count == 7 and s.width == 1


def test_series_memory_is_bounded_and_the_shape_kept_over_200k_points():
    rng = random.Random(0)
    s = Series(capacity=1024)
    ys = [math.exp(-i / 50_000) + rng.gauss(0, 0.05) for i in range(200_000)]
    ys[123_456] = 5.0  # one spike must survive downsampling
    started = time.perf_counter()
    for i, y in enumerate(ys):
        s.add(i, y)
    per_point = (time.perf_counter() - started) / len(ys)
    assert s.count == 200_000
    assert len(s) <= 1024 and s.width >= 200_000 // 1024
    xs, drawn = s.xy()
    assert len(xs) <= 2 * 1024
    assert xs == sorted(xs) and xs[0] < s.width and xs[-1] >= 200_000 - 2 * s.width
    assert max(drawn) == 5.0 and min(drawn) == min(ys)
    # the trend: the mean of each tenth of the drawn curve follows exp(-x / 50k)
    means = Series(capacity=1024, mode="mean")
    means.extend(enumerate(ys))
    mx, my = means.xy()
    for lo in range(0, len(mx), len(mx) // 10):
        chunk = list(zip(mx[lo : lo + 20], my[lo : lo + 20]))
        expected = sum(math.exp(-x / 50_000) for x, _ in chunk) / len(chunk)
        assert abs(sum(y for _, y in chunk) / len(chunk) - expected) < 0.05
    assert per_point < 20e-6, f"{per_point * 1e6:.1f} µs per point"


def test_series_rejects_a_capacity_that_cannot_hold_a_merge():
    with pytest.raises(ValueError):
        Series(capacity=1)


# ---------------------------------------------------------------------- JobView


def view_of(events, **options) -> JobView:
    view = JobView("j", backend="local", epochs=3, workers=2, ps=1, **options)
    for event in events:
        view.apply(event)
    return view


def test_replaying_from_zero_rebuilds_the_view_even_with_events_delivered_twice():
    events = eventful_job()
    live = view_of(events)
    # a reader that lost its stream and resumed a few events back sees some twice
    resumed = view_of(events[:20] + events[15:])
    now = T0 + 100
    assert resumed.snapshot(now) == live.snapshot(now)
    assert live.last_seq == len(events) - 1


def test_the_view_of_a_whole_job():
    events = eventful_job()
    view = view_of(events)
    assert (view.state, view.reason, view.phase) == ("succeeded", "all epochs done", "exporting")
    assert view.elapsed(now=T0 + 1e6) == pytest.approx(events[-1].time - T0)
    assert view.eta(now=T0) is None  # ended
    assert view.progress["records_done"] == 1000 and view.progress["epoch"] == 1
    assert (view.tasks_done, view.tasks_total) == (4, 4)
    assert view.workers == 1 and view.live_workers() == 1
    rows = {(r.role, r.id): r for r in view.rows()}
    assert [(r.role, r.id) for r in view.rows()] == [
        ("ps", 0),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    assert (rows["ps", 0].state, rows["ps", 0].restarts, rows["ps", 0].pid) == ("started", 1, 101)
    assert rows["ps", 0].exit_code is None  # cleared when it came back
    w1 = rows["worker", 1]
    assert (w1.state, w1.signal, w1.reason, w1.pid) == (
        "killed",
        "SIGKILL",
        "killed by SIGKILL",
        201,
    )
    w2 = rows["worker", 2]
    assert (w2.state, w2.restarts, w2.replaces, w2.exit_code) == ("succeeded", 1, 1, 0)
    texts = [line.text for line in view.log]
    assert texts == [
        "job started",
        "scaling workers 0 -> 2",
        "worker 1 killed by SIGKILL",
        "re-queued 3 minibatches of epoch 1",
        "relaunched worker 2 (replacing 1: killed by SIGKILL)",
        "evaluation at step 20: accuracy 0.5000, auc 0.6000",
        "ps 0 exit code 1",
        "relaunched ps 0 (replacing 0: exit code 1)",
        "PS 0 restored version 10; 2 updates rolled back and redone",
        "scaling workers 2 -> 1",
        "evaluation at step 24: accuracy 0.7500, auc 0.8000",
        "phase: exporting",
        "model exported to /x/model.keras",
        "final checkpoint taken (PS versions 20)",
        "job succeeded: all epochs done",
    ]
    errors = [line.text for line in view.log if line.error]
    assert errors == [
        "worker 1 killed by SIGKILL",
        "ps 0 exit code 1",
        "PS 0 restored version 10; 2 updates rolled back and redone",
    ]


def test_loss_and_evaluation_series():
    view = view_of(eventful_job())
    xs, ys = view.loss.xy()
    assert xs == list(range(1, 25))
    assert ys[:20] == [2.0 / n for n in range(1, 21)] and ys[20:] == [
        1.0 / n for n in range(21, 25)
    ]
    assert view.last_loss == 1.0 / 24
    assert sorted(view.metrics) == ["accuracy", "auc"]
    assert view.metrics["accuracy"].xy() == ([20.0, 24.0], [0.5, 0.75])
    assert view.metrics["auc"].xy() == ([20.0, 24.0], [0.6, 0.8])


def test_elapsed_and_eta_of_a_running_job():
    ev = Events()
    ev("job_state", at=T0, state="running", reason="started", **progress(0, 0, rate=0.0))
    view = view_of(ev.list)
    assert view.eta(now=T0 + 1) is None  # no rate yet
    assert view.elapsed(now=T0 + 7) == 7
    # epoch 1 of 3: 250 of 1000 records done, 50 records/s -> (750 + 2 * 1000) / 50 = 55 s
    view.apply(ev("progress", at=T0 + 5, **progress(0, 250, rate=50.0, step=4)))
    assert view.eta(now=T0 + 5) == pytest.approx(55.0)
    assert view.eta(now=T0 + 15) == pytest.approx(45.0)  # counts down between reports
    assert view.eta(now=T0 + 500) == 0.0
    view.apply(ev("epoch", at=T0 + 6, epoch=1, tasks=4))
    view.apply(ev("progress", at=T0 + 10, **progress(1, 500, rate=100.0, step=8)))
    assert view.eta(now=T0 + 10) == pytest.approx((500 + 1000) / 100)
    view.apply(
        ev(
            "job_state",
            at=T0 + 12,
            state="stopped",
            reason="stopped by the user",
            **progress(1, 500, rate=100.0),
        )
    )
    assert view.eta(now=T0 + 13) is None
    assert view.elapsed(now=T0 + 99) == 12


def test_the_event_log_keeps_the_last_lines_only():
    ev = Events()
    for i in range(500):
        ev("requeue", epoch=0, batches=i + 1, worker=0, task=i)
    view = view_of(ev.list, log_lines=200)
    assert len(view.log) == 200
    assert view.log[0].text == "re-queued 301 minibatches of epoch 1"
    assert view.log[-1].text == "re-queued 500 minibatches of epoch 1"


def test_a_worker_relaunched_twice_counts_its_restarts():
    ev = Events()
    ev("instance", role="worker", id=0, kind="started", pid=1)
    ev("instance", role="worker", id=0, kind="failed", exit_code=137, reason="exit code 137")
    ev("relaunch", role="worker", id=1, replaces=0, reason="exit code 137")
    ev("instance", role="worker", id=1, kind="oom", reason="out of memory")
    ev("relaunch", role="worker", id=2, replaces=1, reason="out of memory")
    ev("instance", role="worker", id=2, kind="running", pid=3)
    view = view_of(ev.list)
    rows = {r.id: r for r in view.rows()}
    assert (rows[0].exit_code, rows[0].reason) == (137, "exit code 137")
    assert (rows[1].state, rows[1].restarts, rows[1].replaces) == ("oom", 1, 0)
    assert (rows[2].state, rows[2].restarts, rows[2].replaces, rows[2].pid) == ("running", 2, 1, 3)


def test_expected_exits_are_not_logged_and_routine_events_not_described():
    ev = Events()
    retired = ev("instance", role="worker", id=3, kind="killed", expected=True)
    assert describe(retired) is None
    assert describe(ev("loss", worker=0, points=[[1, 0.5]])) is None
    assert describe(ev("progress", **progress(0, 10))) is None
    assert describe(ev("checkpoint", versions=[3, 4], final=False)) == (
        "checkpoint taken (PS versions 3, 4)"
    )
    refused = ev("relaunch_refused", role="worker", id=4, reason="crash budget used up")
    assert describe(refused) == "not relaunching worker 4: crash budget used up"


def test_the_log_tells_when_every_replica_was_lost_and_what_the_next_group_starts_from():
    restored = Event(
        7, 0.0, "group",
        {"version": 5, "members": [], "joined": [], "left": [0, 1, 2], "reason": "restored",
         "step": 70, "restore": "/jobs/j/checkpoints/replicas-000000000070.json", "addresses": []},
    )  # fmt: skip
    formed = Event(
        8, 0.0, "group",
        {"version": 6, "members": [3, 4, 5], "joined": [3, 4, 5], "left": [], "reason": "formed",
         "restore": restored.data["restore"], "addresses": ["a", "b", "c"]},
    )  # fmt: skip
    assert describe(restored) == (
        "allreduce group v5: every member lost (workers 0, 1, 2); the job goes back to the "
        "replicas' checkpoint of step 70"
    )
    assert describe(formed) == (
        "allreduce group v6: workers 3, 4, 5 (starting from the replicas' checkpoint "
        "replicas-000000000070.json)"
    )


def test_the_view_counts_predicted_records_and_says_where_they_went():
    from elasticdl_nb.widgets.dashboard_html import status_html

    ev = Events()
    ev("job_state", state="running", reason="started", **progress(0, 0))
    ev("phase", phase="evaluating", previous="training")
    ev("phase", phase="predicting", previous="evaluating")
    ev("prediction_task", worker=0, source=0, start=0, records=64)
    ev("prediction_task", worker=1, source=0, start=64, records=36)
    view = JobView("j")
    for event in ev.list:
        view.apply(event)
    assert view.predicted == 100 and "predicting (100 records done)" in status_html(view, T0)
    done = ev("predictions", path="/job/predictions", records=100)
    view.apply(done)
    assert (view.predicted, view.predictions_path) == (100, "/job/predictions")
    assert describe(done) == (
        "predicted for 100 records in /job/predictions (job.predictions() reads them)"
    )


def test_the_view_says_while_the_master_is_behind_its_workers():
    from elasticdl_nb.widgets.dashboard_html import status_html

    ev = Events()
    ev("job_state", state="running", reason="started", **progress(0, 0))
    behind = ev("master_saturated", calls=256, waiting=192, max_calls=256, threads=64,
                turned_away=1200, longest_wait_s=0.8, calls_per_s=900.0)  # fmt: skip
    view = view_of(ev.list)
    assert view.summary()["master_saturated"] is True
    said = "master behind its workers: 256 calls held, 1,200 turned away"
    assert said in describe(behind) and said in status_html(view, T0)
    caught_up = ev("master_caught_up", seconds=42.0, served=38000, turned_away=5000,
                   longest_wait_s=1.2, calls_per_s=904.8)  # fmt: skip
    view.apply(caught_up)
    assert view.summary()["master_saturated"] is False
    assert "master behind" not in status_html(view, T0)
    assert describe(caught_up).startswith("master caught up after 42 s behind: served 38,000")
    view.apply(ev("master_saturated", calls=256, turned_away=3))
    view.apply(ev("master_restarted", incarnation=1, replayed=10, rebuild_s=0.1, down_s=2.0,
                  adopted=3))  # fmt: skip
    assert view.summary()["master_saturated"] is False  # (the new master's own load)
