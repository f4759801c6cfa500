"""Jobs of model code written for Keras 2 (issue 38): a model-zoo module in ElasticDL's
style whose functional model applies `tf.*` and `tf.keras.backend` functions to its
symbolic tensors, which Keras 3 refuses to build. Such a job is found to be Keras 2 at
launch (or told so), says it in its first event, and runs tf_keras in every process:
real jobs here, with a worker SIGKILLed and every record applied exactly once."""

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
from tests.integration.models import digits_split

ZOO_MODULE = """
import tensorflow as tf
from tensorflow.keras import backend as K


def custom_model():
    pixels = tf.keras.Input(shape=(64,), name="pixels")
    top, bottom = tf.split(pixels, 2, axis=1)  # (a TensorFlow function on symbolic tensors)
    halves = [tf.keras.layers.Dense(32, activation="relu")(h) for h in (top, bottom)]
    hidden = K.concatenate(halves, axis=1)
    return tf.keras.Model(pixels, tf.keras.layers.Dense(10)(hidden))


def loss(labels, predictions):
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return tf.keras.optimizers.Adam(learning_rate=0.005)


def eval_metrics_fn():
    return {"accuracy": tf.keras.metrics.SparseCategoricalAccuracy()}
"""


@pytest.fixture
def zoo(tmp_path):
    path = tmp_path / "keras2_digits.py"
    path.write_text(textwrap.dedent(ZOO_MODULE))
    return path


def _job(zoo, **options):
    (x, y), (xt, yt) = digits_split()
    job = edl.train(
        "keras2_digits.custom_model",
        model_zoo=str(zoo),
        data=(x, y),
        validation_data=(xt, yt),
        minibatch_size=32,
        minibatches_per_task=2,
        **options,
    )
    return job, (x, y), (xt, yt)


@pytest.mark.parametrize("strategy", ["ps", "allreduce"])
def test_a_keras_2_model_is_found_out_and_trains_in_tf_keras_a_worker_killed(
    job_home, zoo, strategy
):
    rng = fault_rng(f"keras2-{strategy}-worker-kill")
    epochs = 6
    job, (x, _), (xt, yt) = _job(
        zoo, workers=2, epochs=epochs, strategy=strategy, record_ledger=True
    )
    steps = epochs * -(-len(x) // 32)
    status = wait_for_step(job, rng.randint(10, steps // 2))
    victim = rng.randrange(2)
    os.kill(pid_of(status, "worker", victim), signal.SIGKILL)
    print(f"killed worker {victim} at step {status['step']}")

    final = job.wait(timeout=300)
    assert final["state"] == "succeeded", final
    started = next(e.data for e in job.events(follow=False) if e.kind == "job_state")
    assert started["keras"] == "2"
    if strategy == "ps":
        assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
    assert final["metrics"]["accuracy"] >= 0.9
    # The model comes back as what it is, a tf_keras model, here beside Keras 3.
    model = job.model()
    assert type(model).__module__.startswith("tf_keras")
    assert float(np.mean(model.predict(xt, verbose=0).argmax(1) == yt)) >= 0.9


def test_told_keras_3_it_is_refused_with_keras_3_s_reason(job_home, zoo):
    with pytest.raises(PreflightError, match="KerasTensor cannot be used as input"):
        _job(zoo, keras_version="3")


def test_elasticdl_s_embedding_trains_on_the_ps_in_a_keras_2_job(job_home, tmp_path):
    # ElasticDL's Embedding (rows on two PS, sparse bags of ids, a combiner) in tf_keras:
    # built on placeholders there (tf_keras calls layers to build a functional model), its
    # rows updated by the tf_keras optimizer's rule on the PS.
    from sklearn.metrics import roc_auc_score

    from tests.integration.models import model_zoo_module

    zoo = model_zoo_module("bag_of_ids")
    (train, test), clicks, true_logits = zoo.write_bag_tfrecords(tmp_path, 20_000, 5_000)
    job = edl.train(
        "bag_of_ids.custom_model",
        model_zoo="examples/model_zoo/bag_of_ids.py",
        data=train,
        validation_data=test,
        workers=2,
        ps=2,
        epochs=2,
        minibatch_size=128,
        keras_version="2",
    )
    final = job.wait(timeout=400)
    assert final["state"] == "succeeded"
    started = next(e.data for e in job.events(follow=False) if e.kind == "job_state")
    assert started["keras"] == "2"
    best = roc_auc_score(clicks, true_logits)
    print(f"AUC: job's evaluation {final['metrics']['auc']:.3f}, ground truth {best:.3f}")
    assert final["metrics"]["auc"] >= 0.5 + 0.5 * (best - 0.5)
