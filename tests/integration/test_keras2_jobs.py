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
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from elasticdl_nb.sdk.preflight import PreflightError
from tests.integration.faults import fault_rng, pid_of, wait_for_step
from tests.integration.models import digits_split
from tests.tensorboard_files import read_scalars

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


def keras2_job(zoo, **options):
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
    job, (x, _), (xt, yt) = keras2_job(
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
        _check_tensorboard_log(job, final)
    assert final["metrics"]["accuracy"] >= 0.9
    # The model comes back as what it is, a tf_keras model, here beside Keras 3.
    model = job.model()
    assert type(model).__module__.startswith("tf_keras")
    assert float(np.mean(model.predict(xt, verbose=0).argmax(1) == yt)) >= 0.9


def _check_tensorboard_log(job, final) -> None:
    """The TensorBoard log of a Keras-2 job: the journal's losses, the tf_keras
    optimizer's learning rate as the PS read it, the final evaluation."""
    events = list(job.events(follow=False))
    scalars = read_scalars(JobDir(job.dir).tensorboard)
    points = [p for e in events if e.kind == "loss" for p in e.data["points"]]
    assert [n for n, _ in scalars["training/loss"]] == [n for n, _ in points]
    assert [v for _, v in scalars["training/loss"]] == pytest.approx([v for _, v in points])
    assert {round(v, 6) for _, v in scalars["training/learning_rate"]} == {0.005}
    assert scalars["evaluation/accuracy"][-1][1] == pytest.approx(final["metrics"]["accuracy"])


def test_told_keras_3_it_is_refused_with_keras_3_s_reason(job_home, zoo):
    with pytest.raises(PreflightError, match="KerasTensor cannot be used as input"):
        keras2_job(zoo, keras_version="3")


def test_a_ps_killed_in_a_keras_2_job_restores_tf_keras_s_optimizer_state(job_home, zoo):
    # The PS's checkpoint holds the tf_keras optimizer's variables (a method there, not a
    # property): restored, what was rolled back is redone, every record applied once.
    rng = fault_rng("keras2-ps-kill")
    epochs = 6
    job, (x, _), (xt, yt) = keras2_job(
        zoo, workers=2, epochs=epochs, checkpoint_steps=25, record_ledger=True
    )
    steps = epochs * -(-len(x) // 32)
    status = wait_for_step(job, rng.randint(30, steps // 2))
    os.kill(pid_of(status, "ps", 0), signal.SIGKILL)
    print(f"killed the PS at step {status['step']}")
    final = job.wait(timeout=300)
    assert final["state"] == "succeeded", final
    restored = [e.data for e in job.events(follow=False) if e.kind == "ps_restored"]
    assert len(restored) == 1
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
    assert final["metrics"]["accuracy"] >= 0.9


LAYER_MODULE = """
import tensorflow as tf
from tensorflow.keras import backend as K


class Scale(tf.keras.layers.Layer):
    # x times a learned vector: a Keras-2 layer of the module's own.

    def build(self, input_shape):
        self.factor = self.add_weight(name="factor", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.factor


def custom_model():
    pixels = tf.keras.Input(shape=(64,))
    hidden = tf.keras.layers.Dense(64, activation="relu")(K.relu(Scale()(pixels)))
    return tf.keras.Model(pixels, tf.keras.layers.Dense(10)(hidden))


def loss(labels, predictions):
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return tf.keras.optimizers.Adam(learning_rate=0.005)
"""

# A notebook started with TF_USE_LEGACY_KERAS=1: its jobs are Keras 2, and job.model()
# gives the module's own layer class back.
LEGACY_NOTEBOOK = """
import sys
import numpy as np
import elasticdl_nb as edl
from tests.integration.models import digits_split

(x, y), (xt, yt) = digits_split()
job = edl.train("k2_layers.custom_model", model_zoo=sys.argv[1], data=(x, y), workers=2,
                epochs=6, minibatch_size=32, export_format="both")
assert job.wait(timeout=300, progress=False)["state"] == "succeeded"
model = job.model()
layer = model.layers[1]
outputs = model.predict(xt, verbose=0)
np.save(sys.argv[2], outputs)
accuracy = float(np.mean(outputs.argmax(1) == yt))
print("RESULT", type(layer).__module__, type(layer).__name__, round(accuracy, 3), job.name)
"""


def test_a_keras_2_model_s_own_layers_come_back_in_a_keras_2_notebook(job_home, tmp_path):
    import subprocess
    import sys

    zoo = tmp_path / "k2_layers.py"
    zoo.write_text(textwrap.dedent(LAYER_MODULE))
    done = subprocess.run(
        [sys.executable, "-c", LEGACY_NOTEBOOK, str(zoo), str(tmp_path / "outputs.npy")],
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    module, name, accuracy, job_name = done.stdout.split("RESULT")[-1].split()
    assert (module, name) == ("k2_layers", "Scale") and float(accuracy) >= 0.9
    # Here, in Keras 3, the class cannot go to tf_keras: said, with where it loads and
    # what serves here; the SavedModel tf_keras exported does, with the model's outputs.
    job = edl.attach(job_name)
    serves_here = r"TF_USE_LEGACY_KERAS=1; its SavedModel serves here.*job\.saved_model\(\)"
    with pytest.raises(edl.NoModelYet, match=serves_here):
        job.model()
    _, (xt, _) = digits_split()
    saved = job.saved_model()  # (kept while called: its functions use its variables)
    served = saved.serve(xt.astype("float32")).numpy()
    np.testing.assert_allclose(served, np.load(tmp_path / "outputs.npy"), rtol=1e-4, atol=1e-5)
