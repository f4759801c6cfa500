"""The baseline the ElasticDL-style modules are held to: their own code run as a plain
single-process Keras 2 training loop, as a user of TensorFlow 2.x would have run it
before ElasticDL: `feed` over the training records in minibatches of the same size, a
GradientTape step with the module's loss and optimizer (its ElasticDL
LearningRateScheduler, if any, by the step), then the module's metrics on the test data.

    TF_USE_LEGACY_KERAS=1 python -m tests.integration.elasticdl_style.plain_loop \\
        MODULE_FILE TRAIN TEST EPOCHS MINIBATCH      # prints the metrics as JSON

Records come from TFRecord files or staged-array directories, read by the job's readers;
an ElasticDL Embedding holds its whole table here (`whole_tables`), as Keras's does.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import tensorflow as tf

from elasticdl_nb.data import open_reader, resolve_sources
from elasticdl_nb.layers.embedding import whole_tables
from elasticdl_nb.model.contract import Mode, ModelContract, call_model
from elasticdl_nb.model.metrics import make_eval_metrics


def records(path: str):
    (source,) = resolve_sources([path])
    return open_reader(source).read(0, source.num_records)


def dataset(contract: ModelContract, path: str, mode: str, batch: int, seed: int = 0):
    raw = records(path)
    data = tf.data.Dataset.from_tensor_slices(raw)
    if contract.feed is not None:
        data = contract.feed(data, mode, None)
    if mode == Mode.TRAINING:
        data = data.shuffle(10_000, seed=seed)
    return data.batch(batch)


def main(module_file: str, train: str, test: str, epochs: int, batch: int) -> dict:
    spec = importlib.util.spec_from_file_location("zoo", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    contract = ModelContract.from_namespace(vars(module))
    with whole_tables():
        model = contract.custom_model()
    optimizer = contract.optimizer()
    schedule = contract.version_schedule()
    step = 0
    for epoch in range(epochs):
        for features, labels in dataset(contract, train, Mode.TRAINING, batch, seed=epoch):
            if schedule is not None:
                optimizer.learning_rate = schedule(step)
            with tf.GradientTape() as tape:
                loss = contract.loss(labels, call_model(model, features, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            step += 1
    metrics = make_eval_metrics(contract)
    for features, labels in dataset(contract, test, Mode.EVALUATION, 512):
        predictions = call_model(model, features, training=False)
        for metric in metrics.values():
            metric.update_state(labels, predictions)
    return {name: float(np.asarray(m.result()).mean()) for name, m in metrics.items()}


if __name__ == "__main__":
    file, train, test, epochs, batch = sys.argv[1:]
    print(json.dumps(main(file, train, test, int(epochs), int(batch))))
