"""ElasticDL's callbacks, for a model's `callbacks()` (also importable as
`elasticdl.python.elasticdl.callbacks`), beside any Keras callback.

A job calls every callback in its master (`runtime/master/callbacks.py`): Keras's
`EarlyStopping`, `LearningRateScheduler`, `ReduceLROnPlateau` or one of your own act on
the job through `self.model.stop_training` and `self.model.optimizer.learning_rate`. These
three are ElasticDL's:
- `MaxStepsStopping(max_steps)`: ends training once `max_steps` minibatches are applied.
- `LearningRateScheduler(schedule)`: `schedule(model_version)` is the learning rate of
  the update that makes version `model_version + 1`, evaluated by each PS for each of its
  updates (by each replica for each step with the allreduce strategy), so it is exact.
- `SavedModelExporter(export_dir=None)`: the job also exports a TensorFlow SavedModel, to
  `export_dir` (default: the job directory's `saved_model/`).
"""

from elasticdl_nb.callbacks.elasticdl import (
    LearningRateScheduler,
    MaxStepsStopping,
    SavedModelExporter,
)

__all__ = ["LearningRateScheduler", "MaxStepsStopping", "SavedModelExporter"]
