"""ElasticDL's callback classes (see the package docstring for what each one does)."""

from __future__ import annotations

from collections.abc import Callable

from elasticdl_nb.keras_flavor import keras


class MaxStepsStopping(keras.callbacks.Callback):
    """Stop training once `max_steps` minibatches are applied (checked as each training
    task ends, so a few more minibatches of tasks already running may be applied)."""

    def __init__(self, max_steps: int):
        super().__init__()
        if int(max_steps) < 1:
            raise ValueError(f"MaxStepsStopping needs max_steps >= 1, got {max_steps!r}.")
        self.max_steps = int(max_steps)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        step = (logs or {}).get("step", batch)
        if step >= self.max_steps:
            self.model.stop_training = True


class LearningRateScheduler(keras.callbacks.Callback):
    """The learning rate as a function of the model version: `schedule(model_version)`.

    Unlike Keras's `LearningRateScheduler` (a function of the epoch, applied by the
    master at each epoch's start), this one is applied where the update happens: each PS
    sets it for every update it applies, from its own version."""

    def __init__(self, schedule: Callable[[int], float]):
        super().__init__()
        if not callable(schedule):
            raise TypeError("LearningRateScheduler(schedule): schedule must be a function.")
        self.schedule = schedule

    def rate_at(self, version: int) -> float:
        rate = float(self.schedule(int(version)))
        if not rate > 0:
            raise ValueError(
                f"LearningRateScheduler: schedule({version}) returned {rate}; a learning rate "
                "must be positive."
            )
        return rate


class SavedModelExporter(keras.callbacks.Callback):
    """Export a TensorFlow SavedModel (with a serving signature) when the job ends."""

    def __init__(self, export_dir: str | None = None):
        super().__init__()
        self.export_dir = None if export_dir is None else str(export_dir)
