"""The job's TensorBoard log (runtime/master/summaries.py, tensorboard_log.py): the
scalars each journal event implies; the event file as TensorBoard's own reader reads it;
every point exactly once across masters that died while writing it; no TensorFlow in
the process that writes it."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elasticdl_nb.runtime.job_dir import JobDir, read_json
from elasticdl_nb.runtime.master.journal import Journal, read_journal_file
from elasticdl_nb.runtime.master.summaries import Scalar, Summaries
from elasticdl_nb.runtime.master.tensorboard_log import POSITION, TensorBoardLog
from tests.conftest import REPO
from tests.tensorboard_files import read_scalars
from tests.unit.timed_journal import T0, TimedJournal


def a_job(j: TimedJournal) -> None:
    """A small job's journal: two workers, one killed and relaunched, the master lost."""
    j.at(0, "job_state", state="running", reason="started")
    j.at(1, "instance", role="ps", id=0, kind="started", pid=9)
    j.at(1, "instance", role="worker", id=0, kind="started", pid=10)
    j.at(1, "instance", role="worker", id=1, kind="started", pid=11)
    j.at(5, "loss", worker=0, points=[[0, 2.5], [1, 2.25]])
    j.at(6, "loss", worker=1, points=[[2, 2.0], [3, 1.5]], learning_rates=[[2, 0.1], [3, 0.05]])
    j.at(7, "progress", step=4, records_per_second=128.0, goodput=1.0)
    j.at(8, "instance", role="worker", id=1, kind="killed", signal="SIGKILL", expected=False)
    j.at(9, "relaunch", role="worker", id=2, replaces=1, reason="killed")
    j.at(9, "instance", role="worker", id=2, kind="started", pid=12)
    j.at(10, "evaluation", round=0, step=4, metrics={"accuracy": 0.75, "auc": float("nan")})
    j.at(12, "master_restarted", incarnation=1, pid=13, replayed=12)
    j.at(13, "progress", step=6, records_per_second=100.0, goodput=0.9)


def test_each_journal_event_gives_its_scalars_at_its_step():
    j = TimedJournal()
    a_job(j)
    summaries = Summaries()
    got = [s for e in j.read(0, follow=False) for s in summaries.scalars(e)]
    t = T0
    assert got == [
        Scalar("job/live_workers", 0, 1, t + 1),
        Scalar("job/live_workers", 0, 2, t + 1),
        Scalar("training/loss", 0, 2.5, t + 5),
        Scalar("training/loss", 1, 2.25, t + 5),
        Scalar("training/loss", 2, 2.0, t + 6),
        Scalar("training/learning_rate", 2, 0.1, t + 6),
        Scalar("training/loss", 3, 1.5, t + 6),
        Scalar("training/learning_rate", 3, 0.05, t + 6),
        Scalar("training/records_per_second", 4, 128.0, t + 7),
        Scalar("training/goodput", 4, 1.0, t + 7),
        Scalar("job/live_workers", 4, 1, t + 8),  # (a PS is not a worker)
        Scalar("job/relaunches", 4, 1, t + 9),
        Scalar("job/live_workers", 4, 2, t + 9),
        Scalar("evaluation/accuracy", 4, 0.75, t + 10),  # (a NaN metric is left out)
        Scalar("job/master_restarts", 4, 1, t + 12),
        Scalar("training/records_per_second", 6, 100.0, t + 13),
        Scalar("training/goodput", 6, 0.9, t + 13),
    ]


def test_a_retiring_worker_is_no_longer_live_and_its_exit_changes_nothing():
    j = TimedJournal()
    for w in (0, 1):
        j.at(1, "instance", role="worker", id=w, kind="started")
    j.at(2, "instance", role="worker", id=1, kind="retiring")
    j.at(3, "instance", role="worker", id=1, kind="succeeded", expected=True)
    summaries = Summaries()
    got = [(s.tag, s.value) for e in j.read(0, follow=False) for s in summaries.scalars(e)]
    assert got == [("job/live_workers", 1), ("job/live_workers", 2), ("job/live_workers", 1)]


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    return {
        tag: [(step, round(value, 6)) for step, value in points]
        for tag, points in read_scalars(logdir).items()
    }


def test_tensorboard_reads_the_log_back(tmp_path):
    j = TimedJournal(tmp_path / "events.jsonl")
    log = TensorBoardLog(j, tmp_path / "tb", flush_seconds=0.01).start()
    a_job(j)
    j.close()
    log.close()
    assert not log._thread.is_alive()
    got = scalars(tmp_path / "tb")
    assert got["training/loss"] == [(0, 2.5), (1, 2.25), (2, 2.0), (3, 1.5)]
    assert got["training/learning_rate"] == [(2, 0.1), (3, 0.05)]
    assert got["evaluation/accuracy"] == [(4, 0.75)]
    assert got["training/records_per_second"] == [(4, 128.0), (6, 100.0)]
    assert [v for _, v in got["job/live_workers"]] == [1, 2, 1, 2]
    assert got["job/relaunches"] == [(4, 1.0)] and got["job/master_restarts"] == [(4, 1.0)]
    assert read_json(tmp_path / "tb" / POSITION)["seq"] == len(j)


def test_a_master_that_died_after_writing_but_before_saving_the_position(tmp_path):
    """The window a crash can hit: records flushed, their position not saved. The next
    master cuts them off and writes them again: each point once, none lost."""
    events, logdir = tmp_path / "events.jsonl", tmp_path / "tb"

    def master_writes(first: int, count: int) -> None:
        journal = Journal(events)  # (continues the file, as a master that took over)
        log = TensorBoardLog(journal, logdir, flush_seconds=0.01).start()
        for n in range(first, first + count):
            journal.append("loss", worker=0, points=[[n, n / 100]])
        journal.close()
        log.close()

    master_writes(0, 30)
    saved = (logdir / POSITION).read_text()  # the position after the first 30 points
    master_writes(30, 30)
    size = next(logdir.glob("*tfevents*")).stat().st_size
    (logdir / POSITION).write_text(saved)  # as if the second master died before saving it
    master_writes(60, 5)

    assert [e.data["points"][0][0] for e in read_journal_file(events)] == list(range(65))
    assert scalars(logdir)["training/loss"] == [(n, n / 100) for n in range(65)]
    assert len(list(logdir.glob("*tfevents*"))) == 1
    assert next(logdir.glob("*tfevents*")).stat().st_size > size  # cut, then written on


def test_masters_killed_while_writing_leave_every_point_once_and_import_no_tensorflow(tmp_path):
    """Real processes SIGKILLed at random moments while they journal and write the log."""
    rng = random.Random(18)
    files = JobDir(tmp_path)

    def master(count: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.unit.tensorboard_master", str(tmp_path), str(count)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )

    for _ in range(3):
        proc = master(100_000)
        deadline = time.monotonic() + 30
        seq = (read_json(files.tensorboard / POSITION) or {}).get("seq", 0)
        while (read_json(files.tensorboard / POSITION) or {}).get("seq", 0) <= seq + 20:
            assert proc.poll() is None and time.monotonic() < deadline, "it never wrote"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    last = master(50)
    out, _ = last.communicate(timeout=60)
    assert last.returncode == 0
    assert json.loads(out) == {
        "tensorflow": False,
        "seq": len(list(read_journal_file(files.events))),
    }

    journaled = [p for e in read_journal_file(files.events) for p in e.data["points"]]
    assert len(journaled) > 4 * 20 * 10
    written = scalars(files.tensorboard)["training/loss"]
    assert [n for n, _ in written] == [n for n, _ in journaled]  # each once, in order
    assert [v for _, v in written] == pytest.approx([v for _, v in journaled], abs=1e-6)
