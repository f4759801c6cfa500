"""Callbacks in real jobs: called in the master, acting on the whole job."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from elasticdl_nb.callbacks import LearningRateScheduler, MaxStepsStopping, SavedModelExporter
from elasticdl_nb.errors import ElasticDLError
from tests.conftest import job_processes
from tests.integration.models import accuracy, digits_job, paced_loss

pytestmark = pytest.mark.slow


def _end_reason(events) -> str:
    return [e.data["reason"] for e in events if e.kind == "job_state"][-1]


def _epochs_of_losses(events) -> list[tuple[int, float]]:
    """(epoch, learning rate) of every loss point, by the epoch it was reported in."""
    epoch, found = -1, []
    for event in events:
        if event.kind == "epoch":
            epoch = event.data["epoch"]
        elif event.kind == "loss":
            found += [(epoch, rate) for _, rate in event.data.get("learning_rates", [])]
    return found


def test_keras_early_stopping_and_an_epoch_schedule_act_on_the_job_from_its_master(job_home):
    # No epoch improves val_accuracy by 1.0: EarlyStopping stops after the second epoch.
    stop = keras.callbacks.EarlyStopping(
        monitor="val_accuracy", mode="max", min_delta=1.0, patience=1
    )
    rates = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.002 * 0.5**epoch)
    # Paced (50 ms a step: an epoch ~1 s): epoch 2, started while epoch 1 is evaluated,
    # still has tasks queued when the stop comes. Unpaced (~3 ms a step), a busy machine
    # had handed all of them out first, and the stop had nothing to drop.
    job, _, (xt, yt) = digits_job(workers=2, epochs=8, callbacks=[stop, rates], loss=paced_loss)
    final = job.wait(timeout=300)
    events = list(job.events(follow=False))

    assert final["state"] == "succeeded"
    reason = "stopped early by EarlyStopping at the end of epoch 1"
    assert _end_reason(events) == reason
    [stopped] = [e.data for e in events if e.kind == "training_stopped"]
    assert stopped["reason"] == reason and stopped["dropped"] > 0
    started = [e.data["epoch"] for e in events if e.kind == "epoch"]
    assert started[:2] == [0, 1] and len(started) <= 3  # (epoch 2 trains while 1 evaluates)
    # The schedule's rate of each epoch is the rate its updates were applied with.
    set_rates = [e.data["rate"] for e in events if e.kind == "learning_rate"]
    assert set_rates == pytest.approx([0.002 * 0.5**e for e in started])
    applied = _epochs_of_losses(events)
    assert {e for e, _ in applied} == set(started)
    for epoch, rate in applied:
        assert rate == pytest.approx(0.002 * 0.5**epoch, rel=1e-6)
    # A final evaluation, the export, and nothing left behind.
    assert [e.data["final"] for e in events if e.kind == "evaluation"][-1] is True
    assert accuracy(job.model(), xt, yt) == pytest.approx(final["metrics"]["accuracy"], abs=1e-6)
    assert job_processes(job_home) == []


def test_elasticdl_callbacks_schedule_by_version_on_the_ps_stop_at_max_steps_and_export(
    job_home, tmp_path
):
    def schedule(version):
        return 0.004 if version < 40 else 0.001

    exported = tmp_path / "served"
    job, _, (xt, _) = digits_job(
        workers=2,
        epochs=10,
        minibatches_per_task=2,
        callbacks=[
            MaxStepsStopping(100),
            LearningRateScheduler(schedule),
            SavedModelExporter(str(exported)),
        ],
    )
    final = job.wait(timeout=300)
    events = list(job.events(follow=False))

    assert final["state"] == "succeeded"
    assert _end_reason(events).startswith("stopped early by MaxStepsStopping at step ")
    [stopped] = [e.data for e in events if e.kind == "training_stopped"]
    # Checked as tasks end: the tasks running then still finish (2 minibatches each).
    assert 100 <= stopped["step"] and final["step"] <= stopped["step"] + 2 * 2 * 2
    # Each update's rate is the schedule's at its version: one switch, per worker.
    for worker in (0, 1):
        rates = [
            rate
            for e in events
            if e.kind == "loss" and e.data["worker"] == worker
            for _, rate in e.data["learning_rates"]
        ]
        switch = rates.index(pytest.approx(0.001))
        np.testing.assert_allclose(rates[:switch], 0.004, rtol=1e-6)
        np.testing.assert_allclose(rates[switch:], 0.001, rtol=1e-6)
    assert not [e for e in events if e.kind == "learning_rate"]  # (not set by the master)
    # SavedModelExporter: a SavedModel where it asked, serving the exported model.
    import tensorflow as tf

    served = tf.saved_model.load(str(exported))
    np.testing.assert_allclose(
        served.serve(xt[:50]).numpy(), job.model().predict(xt[:50], verbose=0), atol=1e-5
    )


def test_a_rate_set_by_a_callback_is_applied_by_every_allreduce_replica_alike(job_home):
    from elasticdl_nb.runtime.worker.replica_records import read_checksums

    rates = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.004 / (epoch + 1))
    job, _, _ = digits_job(workers=2, epochs=3, strategy="allreduce", callbacks=[rates])
    final = job.wait(timeout=300)
    events = list(job.events(follow=False))

    assert final["state"] == "succeeded"
    # Each step's rate (in step order): the epochs' rates, each from one step on, never
    # back. (Which epoch a step is in the journal does not say: an allreduce member
    # reports the loss of a step after the step.)
    steps = [point for e in events if e.kind == "loss" for point in e.data["learning_rates"]]
    assert [n for n, _ in steps] == list(range(1, len(steps) + 1))
    runs = [rate for i, (_, rate) in enumerate(steps) if i == 0 or rate != steps[i - 1][1]]
    assert runs == pytest.approx([0.004, 0.002, 0.004 / 3], rel=1e-6)
    ends = [r for r in read_checksums(job.dir) if r["event"] == "end"]
    assert len(ends) == 2 and len({r["checksum"] for r in ends}) == 1  # replicas identical


@pytest.mark.parametrize(
    "callback, words",
    [
        (keras.callbacks.ModelCheckpoint("/tmp/x.keras"), "ModelCheckpoint needs the model"),
        (
            keras.callbacks.EarlyStopping(restore_best_weights=True),
            "drop restore_best_weights",
        ),
    ],
    ids=["ModelCheckpoint", "restore_best_weights"],
)
def test_callbacks_the_master_cannot_call_are_refused_before_launch(job_home, callback, words):
    with pytest.raises(ElasticDLError, match=words):
        digits_job(workers=1, epochs=1, callbacks=[callback])
    assert job_processes(job_home) == []
