"""The model's callbacks as the master calls them: what they decide, what they may not
touch, and their state rebuilt by a master that takes the job over."""

import pytest

keras = pytest.importorskip("keras")

from elasticdl_nb.callbacks import LearningRateScheduler  # noqa: E402
from elasticdl_nb.runtime.master.callbacks import (  # noqa: E402
    CallbackError,
    JobCallbacks,
    check_callbacks,
)


def _started(callbacks, record=None, replay=None):
    job_callbacks = JobCallbacks(lambda: (callbacks, 0.01), record)
    if replay is not None:
        job_callbacks.replay(*replay)
    job_callbacks.start()
    assert job_callbacks.loaded.wait(30) and job_callbacks.error is None
    return job_callbacks


def _early_stopping():
    return keras.callbacks.EarlyStopping(monitor="val_accuracy", mode="max", patience=2)


ACCURACIES = [0.5, 0.7, 0.69, 0.68, 0.66]  # best at epoch 1: the stop comes at epoch 3


def _epochs(job_callbacks, epochs):
    """Call epoch ends; the epoch whose end stopped training, else None."""
    for epoch in epochs:
        job_callbacks.losses([1.0 / (epoch + 1)])
        job_callbacks.epoch_trained(epoch)
        if job_callbacks.epoch_end(epoch, {"accuracy": ACCURACIES[epoch]}).stop:
            return epoch
    return None


def test_early_stopping_decides_the_stop_and_names_itself():
    job_callbacks = _started([_early_stopping()])
    assert _epochs(job_callbacks, range(5)) == 3
    decided = job_callbacks.epoch_end(4, {"accuracy": 0.1})
    assert decided.stop == ""  # (decided once: the master acts on it once)


def test_a_master_that_takes_over_rebuilds_the_callbacks_state_from_their_journaled_calls():
    calls = []
    first = _started([_early_stopping()], lambda *call: calls.append(call))
    assert _epochs(first, range(2)) is None  # the master dies after epoch 1's end
    assert [hook for hook, _, _ in calls] == ["on_train_begin", "on_epoch_end", "on_epoch_end"]
    assert calls[1][2] == {"loss": 1.0, "val_accuracy": 0.5}

    stopping = _early_stopping()
    second = _started([stopping], replay=(calls, False, 0.0))
    assert (stopping.best, stopping.wait) == (0.7, 0)
    assert _epochs(second, range(2, 5)) == 3  # as if no master had died
    # Without the calls again, a fresh EarlyStopping takes epoch 2 for its best: a
    # stop one epoch late.
    assert _epochs(_started([_early_stopping()]), range(2, 5)) == 4


def test_a_learning_rate_set_through_the_model_is_a_decision():
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 2)
    job_callbacks = _started([schedule])
    decided = job_callbacks.epoch_begin(0)
    assert (decided.learning_rate, decided.set_by) == (0.005, "LearningRateScheduler")
    assert job_callbacks.epoch_begin(1).learning_rate == 0.0025


def test_a_callback_that_reaches_for_the_weights_fails_saying_what_it_can_use():
    class Peeks(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            assert not hasattr(self.model, "metrics")  # (hasattr works: False)
            self.model.get_weights()

    job_callbacks = _started([Peeks()])
    with pytest.raises(CallbackError, match="model.get_weights.*stop_training and "):
        job_callbacks.epoch_end(0, {})


@pytest.mark.parametrize(
    "callbacks, optimizer, words",
    [
        ([keras.callbacks.BackupAndRestore("/tmp/b")], None, "BackupAndRestore needs the model"),
        ([keras.callbacks.TensorBoard()], None, "writes TensorBoard files itself"),
        (
            [keras.callbacks.ReduceLROnPlateau()],
            keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)),
            "is a schedule",
        ),
        (
            [keras.callbacks.ReduceLROnPlateau(), LearningRateScheduler(lambda v: 0.1)],
            None,
            "both set the learning rate",
        ),
        (["not a callback"], None, "not a keras.callbacks.Callback"),
    ],
)
def test_callbacks_the_master_cannot_call_are_named_with_the_fix(callbacks, optimizer, words):
    with pytest.raises(ValueError, match=words):
        check_callbacks(callbacks, optimizer or keras.optimizers.SGD(0.1))
