"""A model-zoo module that reads its data with its own `custom_data_reader` (issue 38,
ElasticDL's contract): records in a text format of its own, in files it cuts into shards
that start inside a file; real jobs train on it and predict with it, every record applied
exactly once (the ledger) with a worker SIGKILLed mid-training; a reader that gives the
wrong number of records fails the job with a message naming the shard."""

from __future__ import annotations

import os
import signal
import textwrap

import numpy as np
import pytest

import elasticdl_nb as edl
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from elasticdl_nb.sdk.preflight import PreflightError
from tests.integration.faults import fault_rng, pid_of, wait_for_step
from tests.integration.models import accuracy, digits_split

# ElasticDL's reader shape: create_shards() -> {name: (first record, records)},
# read_records(task) for task.shard_name [task.start, task.end), records_output_types.
# Each file is cut into shards of at most `shard` records: "<file>@<first record>".
ZOO_MODULE = """
import os

import keras
import tensorflow as tf
from elasticdl.python.common.constants import Mode


class DigitsTextReader:
    def __init__(self, data_dir, sep, shard, short=False):
        self.data_dir, self.sep, self.shard, self.short = data_dir, sep, shard, short
        self.records_output_types = tf.string

    def _lines(self, name):
        with open(os.path.join(self.data_dir, name)) as f:
            return f.read().splitlines()

    def create_shards(self):
        shards = {}
        for name in sorted(os.listdir(self.data_dir)):
            n = len(self._lines(name))
            for first in range(0, n, self.shard):
                shards[f"{name}@{first}"] = (first, min(self.shard, n - first))
        return shards

    def read_records(self, task):
        lines = self._lines(task.shard_name.split("@")[0])
        end = task.end - 1 if self.short else task.end
        for line in lines[task.start : end]:
            yield line

    @property
    def metadata(self):
        return None


def custom_data_reader(data_origin, records_per_task=None, **kwargs):
    return DigitsTextReader(data_dir=data_origin, **kwargs)


def feed(dataset, mode, metadata):
    def parse(line):
        # (a generator's records have no known shape, as in ElasticDL: one line each)
        fields = tf.strings.to_number(tf.strings.split(tf.ensure_shape(line, []), "|"))
        return fields[1:] / 16.0, tf.cast(fields[0], tf.int32)

    parsed = dataset.map(parse)
    if mode == Mode.PREDICTION:
        return parsed.map(lambda x, y: x)
    return parsed


def custom_model():
    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )


def loss(labels, predictions):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return keras.optimizers.Adam(0.005)


def eval_metrics_fn():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy(name="accuracy")}
"""


def _write_digits(directory, x, y, files: int) -> None:
    """The records as '<label>|<64 pixel values>' lines, spread over `files` files."""
    directory.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(x)), files)):
        lines = [f"{y[j]}|" + "|".join(str(int(v * 16)) for v in x[j]) for j in part]
        (directory / f"part-{i}.dig").write_text("\n".join(lines) + "\n")


@pytest.fixture
def zoo(tmp_path):
    (x, y), (xt, yt) = digits_split()
    _write_digits(tmp_path / "train", x, y, files=2)  # 700 + 700 records: shards of 300
    _write_digits(tmp_path / "test", xt, yt, files=1)
    path = tmp_path / "digits_text.py"
    path.write_text(textwrap.dedent(ZOO_MODULE))
    return path, tmp_path, (x, y), (xt, yt)


def test_a_job_trains_and_predicts_through_the_model_s_own_reader_exactly_once(job_home, zoo):
    rng = fault_rng("custom-reader-worker-kill")
    path, root, (x, _), (xt, yt) = zoo
    epochs = 4
    job = edl.train(
        "digits_text.custom_model",
        model_zoo=str(path),
        data=str(root / "train"),
        validation_data=str(root / "test"),
        prediction_data=str(root / "test"),
        data_reader_params="sep='|'; shard=300",
        workers=2,
        epochs=epochs,
        minibatch_size=32,
        minibatches_per_task=2,
        record_ledger=True,
    )
    # Two files of 700 records, cut at 300 and 600: six shards, three starting inside.
    shards = [300, 300, 100, 300, 300, 100]
    steps = epochs * sum(-(-n // 32) for n in shards)
    status = wait_for_step(job, rng.randint(10, steps * 2 // 3))
    victim = rng.randrange(2)
    os.kill(pid_of(status, "worker", victim), signal.SIGKILL)
    print(f"killed worker {victim} at step {status['step']}")

    final = job.wait(timeout=300)
    assert final["state"] == "succeeded"
    assert ledger_problems(job.dir, 1, shards, epochs) == []
    assert final["metrics"]["accuracy"] >= 0.9
    assert accuracy(job.model(), xt, yt) >= 0.9
    # The reader's prediction data, in its order: what the exported model predicts.
    np.testing.assert_allclose(job.predictions(), job.model().predict(xt, verbose=0), atol=1e-4)


def test_a_reader_that_gives_too_few_records_is_refused_naming_the_shard(job_home, zoo):
    path, root, _, _ = zoo
    with pytest.raises(
        PreflightError, match=r"gave 31 records for \[0, 32\) of shard 'part-0.dig@0'"
    ):
        edl.train(
            "digits_text.custom_model",
            model_zoo=str(path),
            data=str(root / "train"),
            data_reader_params="sep='|'; shard=300; short=True",
            minibatch_size=32,
        )
