"""A prediction task on a worker: the trained model's outputs for a range of the
prediction data, given minibatch by minibatch to the model's PredictionOutputsProcessor
(if it has one) and written to the task's file (`runtime/predictions.py`) once the range
is done. How the model is called is the strategy's: a PS worker pulls its parameters, an
allreduce member uses its replica (`predict`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from elasticdl_nb.model.contract import Mode, ModelContract
from elasticdl_nb.runtime.predictions import write_task
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.worker.batches import BatchMaker


class TaskPredictions:
    """Runs a worker's prediction tasks; the processor is made at the first one."""

    def __init__(self, batches: BatchMaker, contract: ModelContract, worker_id: int):
        self._batches, self._contract, self._worker_id = batches, contract, worker_id
        self._processor: Any = None
        self._made = False

    def run(self, task: pb.Task, predict: Callable[[Any], Any]) -> int:
        """Predict for the task's range with `predict(features)`; returns its records."""
        if not self._made:
            self._processor, self._made = self._contract.make_prediction_processor(), True
        r, outputs = task.range, []
        for batch in self._batches.batches(r.source, r.start, r.end, Mode.PREDICTION):
            output = tf.nest.map_structure(np.asarray, predict(batch.features))
            if self._processor is not None:
                self._processor.process(output, self._worker_id)
            outputs.append(output)
        return write_task(Path(task.output_path), outputs)
