"""The one client-side fold of the journal (`JobView`), run alone on journals that real
jobs wrote (tests/journals/, made by tests/journals/record.py): what the text progress,
the dashboard and the server's summaries show is what the job did, and folding a journal
in pieces (a server's repeated looks, a dashboard reattached) gives what one pass gave."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from elasticdl_nb.runtime.master.journal import read_journal_file
from elasticdl_nb.sdk.progress import ProgressPrinter
from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.sdk.view.text import format_goodput
from elasticdl_nb.sdk.view.timeline import MASTER_LOST, PS_LOST, RELAUNCH, STRAGGLER, WORKER_LOST
from elasticdl_nb.server.summary import JobViews
from elasticdl_nb.vocabulary import EventKind, JobState, payload_problems

JOURNALS = Path(__file__).resolve().parents[1] / "journals"
NAMES = sorted(p.name for p in JOURNALS.iterdir() if (p / "events.jsonl").exists())


class RecordedJob:
    """A finished job as its journal file tells it: what `JobView.catch_up` and the
    server's `JobViews` read of a `Job` (name, creation time, files, `events`)."""

    def __init__(self, name: str, upto: int | None = None):
        self.name = name
        self.dir = JOURNALS / name
        self.created = 0.0
        self.backend = "local"
        self.upto = upto  # the journal so far: events below this seq only
        self._journal = JOURNALS / name / "events.jsonl"
        self.asked_from: list[int] = []  # the from_seq of each read, in order

    def events(self, from_seq=0, follow=True, timeout=None):
        self.asked_from.append(from_seq)
        for event in read_journal_file(self._journal, from_seq):
            if self.upto is not None and event.seq >= self.upto:
                return
            yield event


def events_of(name: str) -> list:
    return list(read_journal_file(JOURNALS / name / "events.jsonl"))


def folded(name: str) -> JobView:
    view = JobView.for_job(RecordedJob(name))
    for event in events_of(name):
        view.apply(event)
    return view


def test_there_are_recorded_journals():
    assert {"ps_worker_killed", "master_restarted", "straggler", "stopped"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_recorded_event_has_its_kinds_payload(name):
    problems = [p for e in events_of(name) for p in payload_problems(e.kind, e.data)]
    assert problems == []


@pytest.mark.parametrize("name", NAMES)
def test_folding_in_pieces_gives_what_one_pass_gave(name):
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    events = events_of(name)
    whole = folded(name)
    pieces = JobView.for_job(RecordedJob(name))
    cuts = sorted(rng.sample(range(1, len(events)), 5)) + [len(events)]
    for cut in cuts:  # each look reads only what came since the last
        pieces.catch_up(RecordedJob(name, upto=cut))
    # a stream resumed after a reconnect sends some events again: they change nothing
    for event in events[cuts[0] - 3 : cuts[0]]:
        pieces.apply(event)
    assert pieces.snapshot(now=2e9) == whole.snapshot(now=2e9)


@pytest.mark.parametrize("name", NAMES)
def test_the_view_ends_where_the_job_ended(name):
    view = folded(name)
    state = json.loads((JOURNALS / name / "state.json").read_text())
    spec = json.loads((JOURNALS / name / "spec.json").read_text())
    assert view.state == state["state"] and view.ended
    assert view.live_workers() == 0  # every worker's end is in the journal
    assert view.timeline.now()[0] == 0
    assert view.backend == "local" and view.epochs == spec["epochs"]
    summary = view.summary()
    if view.state == JobState.SUCCEEDED:
        assert summary["progress"]["fraction"] == 1.0
        assert summary["progress"]["epoch"] == spec["epochs"] - 1
        evaluated = any(e.kind == EventKind.EVALUATION for e in events_of(name))
        assert bool(summary["metrics"]) == evaluated
    last = [e for e in events_of(name) if e.kind == EventKind.JOB_STATE][-1]
    assert summary["goodput"] == last.data["goodput"]
    assert view.eta(now=2e9) is None


def test_a_killed_and_relaunched_worker_and_scaling_show_on_the_timeline():
    view = folded("ps_worker_killed")
    kinds = [m.kind for m in view.timeline.marks]
    assert WORKER_LOST in kinds and RELAUNCH in kinds
    assert kinds.index(WORKER_LOST) < kinds.index(RELAUNCH)
    scales = [e.data["workers_to"] for e in events_of("ps_worker_killed") if e.kind == "scale"]
    assert view.timeline.desired.xy()[1] == [float(n) for n in scales] == [2.0, 3.0, 2.0]
    assert max(view.timeline.live.xy()[1]) == 3  # the live workers followed the scale
    relaunched = [r for r in view.rows() if r.replaces is not None]
    assert len(relaunched) == 1 and relaunched[0].restarts == 1
    assert any("re-queued" in line.text for line in view.log)


def test_a_lost_ps_and_a_lost_master_are_marked_and_counted():
    ps = folded("ps_killed")
    assert PS_LOST in [m.kind for m in ps.timeline.marks]
    assert any(line.text.startswith("PS 0 restored version") for line in ps.log)
    master = folded("master_restarted")
    assert [m.kind for m in master.timeline.marks] == [MASTER_LOST]
    assert master.master_restarts == 1 and master.summary()["master_restarts"] == 1


def test_a_straggler_is_shown_while_flagged_and_dropped_once_cleared():
    events = events_of("straggler")
    flagged = next(e for e in events if e.kind == EventKind.STRAGGLER)
    cleared = next(e for e in events if e.kind == EventKind.STRAGGLER_CLEARED)
    worker = flagged.data["worker"]
    out = io.StringIO()
    printer = ProgressPrinter("straggler", out, every_seconds=0)
    for event in events:
        printer.show(event)
        view = printer.view
        if flagged.seq <= event.seq < cleared.seq:
            assert list(view.stragglers) == [worker]
            assert view.summary()["stragglers"] == [worker]
        else:
            assert view.stragglers == {}
    text = out.getvalue()
    assert f"straggler: worker {worker} (" in text  # on the progress lines meanwhile
    assert f"[straggler] worker {worker} is a straggler" in text
    assert f"[straggler] worker {worker} is no longer a straggler" in text
    assert STRAGGLER in [m.kind for m in folded("straggler").timeline.marks]


def test_the_text_progress_says_what_the_view_logged():
    out = io.StringIO()
    printer = ProgressPrinter("j", out, every_seconds=0)
    for event in events_of("ps_worker_killed"):
        printer.show(event)
    lines = out.getvalue().splitlines()
    logged = [f"[j] {line.text}" for line in folded("ps_worker_killed").log]
    assert [line for line in lines if " | " not in line] == logged
    end = [e for e in events_of("ps_worker_killed") if e.kind == "job_state"][-1]
    assert end.data["goodput"] < 1  # a worker was killed: the end line gives the figure
    ending = f"[j] job succeeded: all epochs done ({format_goodput(end.data['goodput'])})"
    assert "[j] job started" in lines and lines[-1] == ending
    assert "goodput" in next(line for line in lines if " | " in line)


def test_the_server_folds_only_what_came_since_its_last_look():
    views = JobViews()
    events = events_of("stopped")
    half = RecordedJob("stopped", upto=len(events) // 2)
    first = views.of(half, JobState.RUNNING)
    seen = first.last_seq
    assert 0 < seen < len(events) - 1 and not first.ended

    whole = RecordedJob("stopped")
    assert views.of(whole, JobState.STOPPED) is first  # the same view, caught up
    assert whole.asked_from == [seen + 1] and first.state == JobState.STOPPED
    assert first.snapshot(2e9) == folded("stopped").snapshot(2e9)
    views.of(whole, JobState.STOPPED)
    assert whole.asked_from == [seen + 1], "an ended job's journal was read again"
    # a job not started yet has no journal to read: none is asked for
    starting = RecordedJob("stopped")
    starting.created = 1.0
    views.of(starting, JobState.STARTING)
    assert starting.asked_from == []


def test_a_job_whose_files_are_not_visible_here_counts_its_ps_from_the_journal():
    job = RecordedJob("ps_killed")
    job.dir = None  # (a Kubernetes job seen from another notebook: no spec to read)
    view = JobView.for_job(job)
    assert view.backend == "?" and view.ps is None
    view.catch_up(job)
    assert view.summary()["ps"] == 1 and view.summary()["workers"]["desired"] == 2


def test_the_server_reads_a_lost_jobs_journal_once_more_then_no_more():
    # A master gone without recording an end: its journal stops short, the status says
    # lost. The view is read up to where the journal stops, then left alone.
    events = events_of("ps_worker_killed")
    job = RecordedJob("ps_worker_killed", upto=len(events) // 2)
    views = JobViews()
    view = views.of(job, JobState.LOST)
    assert view.last_seq == len(events) // 2 - 1 and not view.ended
    views.of(job, JobState.LOST)
    assert job.asked_from == [0]
