"""A job's life outside one Python process: detach, reattach, stop, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import elasticdl_nb as edl
from tests.conftest import job_processes
from tests.integration.faults import wait_for, wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_job_outlives_the_process_that_started_it_and_can_be_reattached(job_home):
    starter = textwrap.dedent("""
        import elasticdl_nb as edl
        from tests.integration.models import DIGITS, custom_model, digits_split
        (x, y), _ = digits_split()
        job = edl.train(custom_model, **DIGITS, data=(x, y), workers=1, epochs=3,
                        name="detached")
        print(job.name)
    """)
    # The starter exits at once, as a notebook kernel that is restarted would.
    done = subprocess.run(
        [sys.executable, "-c", starter],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr
    assert [j["name"] for j in edl.jobs()] == ["detached"]
    job = edl.attach("detached")
    assert job.wait(timeout=300)["state"] == "succeeded"
    assert job.model() is not None
    assert job_processes(job_home) == []


def test_stop_ends_every_process_and_records_the_state(job_home):
    (x, y), _ = digits_split()
    job = edl.train(custom_model, **DIGITS, data=(x, y), workers=2, epochs=200)
    wait_for_step(job, 5)
    assert job_processes(job_home) != []
    final = job.stop()
    assert final["state"] == "stopped"
    assert job_processes(job_home) == []
    states = [e.data["state"] for e in job.events(follow=False) if e.kind == "job_state"]
    assert states == ["running", "stopped"]
    with pytest.raises(ValueError, match="its master is not running"):
        job.scale(3)


def test_events_resume_from_any_sequence_number(job_home):
    (x, y), _ = digits_split()
    job = edl.train(custom_model, **DIGITS, data=(x, y), workers=1, epochs=2)
    first = []
    for event in job.events():
        first.append(event)
        if len(first) == 10:
            break  # a client that goes away mid-stream ...
    rest = list(job.events(from_seq=first[-1].seq + 1))  # ... and comes back
    job.wait(timeout=300)
    replay = list(job.events(follow=False))
    assert [e.seq for e in first + rest] == [e.seq for e in replay]
    states = [e.data["state"] for e in replay if e.kind == "job_state"]
    assert states == ["running", "succeeded"]
    metrics = job.metrics()
    assert len(metrics["loss"]) >= 2 * 22 and metrics["loss"][0][0] == 1  # 22 batches of 64


def test_the_cli_trains_a_model_zoo_module_and_lists_inspects_and_reads_logs(job_home):
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "elasticdl_nb", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ,
        )

    (x, y), (xt, yt) = digits_split()
    data = job_home.parent / "csv"
    data.mkdir()
    import numpy as np

    for name, (a, b) in (("train", (x, y)), ("test", (xt, yt))):
        np.savetxt(data / f"{name}.csv", np.column_stack([a, b]), delimiter=",", fmt="%g")
    zoo = job_home.parent / "digits_csv.py"
    zoo.write_text(
        textwrap.dedent("""
        import keras
        import tensorflow as tf

        def custom_model():
            return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, "relu"),
                                     keras.layers.Dense(10)])

        def loss(labels, predictions):
            return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                tf.cast(labels, tf.int32), predictions, from_logits=True))

        def optimizer():
            return keras.optimizers.Adam(0.01)
    """)
    )
    run = cli(
        "train",
        "--model-zoo",
        str(zoo),
        "--model-def",
        "digits_csv.custom_model",
        "--data",
        str(data / "train.csv"),
        "--validation-data",
        str(data / "test.csv"),
        "--no-csv-header",
        "--workers",
        "1",
        "--epochs",
        "2",
        "--name",
        "from-cli",
        "--wait",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["state"] == "succeeded"
    assert "from-cli" in cli("list").stdout
    assert json.loads(cli("status", "from-cli").stdout)["state"] == "succeeded"
    assert "serving on" in cli("logs", "from-cli").stdout
    assert "worker 0 done" in cli("logs", "from-cli", "--role", "worker").stdout
    bad = cli("train", "--data", "x.csv", "--wrokers", "2")
    assert bad.returncode == 2 and "--wrokers" in bad.stderr
    missing = cli("scale", "no-such-job", "--workers", "2")
    assert missing.returncode == 2 and "No job named 'no-such-job'" in missing.stderr
    wait_for(lambda: job_processes(job_home) == [], 10, "no processes")


def test_wait_with_a_timeout_returns_control_and_leaves_the_job_running(job_home):
    (x, y), _ = digits_split()
    job = edl.train(custom_model, **DIGITS, data=(x, y), workers=1, epochs=200)
    with pytest.raises(TimeoutError, match="no end within 3 s"):
        job.wait(timeout=3, progress=False)
    assert job.status()["state"] == "running"
    assert job.stop()["state"] == "stopped"


def test_wait_without_progress_follows_from_the_journals_end_not_its_start(job_home):
    """Streaming a running job's whole journal costs its master the GIL its workers' calls
    wait for (bench/recovery.py's kill gap); without a printer, `wait` reads none of it."""
    (x, y), _ = digits_split()
    job = edl.train(custom_model, **DIGITS, data=(x, y), workers=1, epochs=40)
    wait_for_step(job, 20)
    before = job.status()["events"]
    assert before > 10
    seen: list[int] = []
    follow = job.events

    def recorded(*args, **kwargs):
        for event in follow(*args, **kwargs):
            seen.append(event.seq)
            yield event

    job.events = recorded
    assert job.wait(timeout=300, progress=False)["state"] == "succeeded"
    assert seen and min(seen) >= before  # nothing older was streamed
    last = next(follow(seen[-1], follow=False))  # where the wait ended: the job's end
    assert last.kind == "job_state" and last.data["state"] == "succeeded"
