"""Bad input fails at once, before anything is launched, with a message that says the fix."""

from __future__ import annotations

import pytest

import elasticdl_nb as edl
from elasticdl_nb.data import DataError
from elasticdl_nb.model import ContractError
from elasticdl_nb.sdk.preflight import PreflightError
from tests.conftest import job_processes
from tests.integration.models import DIGITS, custom_model, digits_split


@pytest.fixture
def digits():
    return digits_split()[0]


def _nothing_launched(home):
    assert job_processes(home) == []
    assert not (home / "jobs").exists() or list((home / "jobs").iterdir()) == []


def test_missing_data_path_names_the_path(job_home, tmp_path):
    with pytest.raises(DataError, match=r"no-such-dir/\*\.csv"):
        edl.train(custom_model, **DIGITS, data=str(tmp_path / "no-such-dir" / "*.csv"))
    _nothing_launched(job_home)


def test_a_model_function_that_raises_is_reported_with_its_error(job_home, digits):
    def custom_model():
        raise RuntimeError("forgot to define the layers")

    with pytest.raises(PreflightError, match="custom_model.*forgot to define the layers"):
        edl.train(custom_model, **DIGITS, data=digits)
    _nothing_launched(job_home)


def test_a_model_function_that_returns_no_keras_model_says_what_to_return(job_home, digits):
    def custom_model():
        return {"layers": 2}

    with pytest.raises(ContractError, match="returned dict, not a Keras model: return e.g."):
        edl.train(custom_model, **DIGITS, data=digits, strategy="allreduce")
    _nothing_launched(job_home)


def test_a_loss_of_the_wrong_shape_names_both_shapes(job_home, digits):
    def broadcasting_loss(labels, predictions):
        import tensorflow as tf

        return tf.square(tf.cast(labels, tf.float32) - predictions)  # [64] - [64, 10]

    with pytest.raises(PreflightError, match=r"loss\(labels, predictions\).*\(64,\).*\(64, 10\)"):
        edl.train(custom_model, loss=broadcasting_loss, optimizer=DIGITS["optimizer"], data=digits)
    _nothing_launched(job_home)


def test_a_non_scalar_loss_is_refused(job_home, digits):
    def per_example_loss(labels, predictions):
        import tensorflow as tf

        return tf.keras.losses.sparse_categorical_crossentropy(
            labels, predictions, from_logits=True
        )

    with pytest.raises(PreflightError, match="must return a scalar.*reduce_mean"):
        edl.train(custom_model, loss=per_example_loss, optimizer=DIGITS["optimizer"], data=digits)
    _nothing_launched(job_home)


def test_a_saved_model_of_a_model_whose_tables_live_on_the_ps_is_refused(job_home):
    """Tables of any int64 id are exported as (id, vector) files: no SavedModel holds them."""
    import numpy as np

    def custom_model():
        import keras

        from elasticdl_nb.layers import Embedding

        ids = keras.Input(shape=(2,), dtype="int64")
        vectors = keras.layers.Flatten()(Embedding(4, name="ids")(ids))
        return keras.Model(ids, keras.layers.Dense(1)(vectors))

    def loss(labels, predictions):
        import tensorflow as tf

        return tf.reduce_mean(tf.square(tf.reshape(labels, [-1]) - predictions[:, 0]))

    def optimizer():
        import keras

        return keras.optimizers.SGD(0.1)

    rng = np.random.default_rng(0)
    data = (rng.integers(0, 2**40, size=(64, 2)), rng.normal(size=64).astype("float32"))
    with pytest.raises(PreflightError, match="SavedModel.*'ids/.*any int64 id.*'keras'"):
        edl.train(custom_model, loss=loss, optimizer=optimizer, data=data, export_format="both")
    _nothing_launched(job_home)


def test_unknown_option_suggests_the_right_one(job_home, digits):
    with pytest.raises(edl.SpecError, match="Did you mean 'minibatch_size'"):
        edl.train(custom_model, **DIGITS, data=digits, batch_size=32)
    _nothing_launched(job_home)


def test_zero_workers_is_refused(job_home, digits):
    with pytest.raises(edl.SpecError, match="'workers' must be at least 1"):
        edl.train(custom_model, **DIGITS, data=digits, workers=0)
    _nothing_launched(job_home)


def test_a_missing_contract_function_says_what_to_define(job_home, digits):
    with pytest.raises(ContractError, match="does not define 'optimizer'"):
        edl.train(custom_model, loss=DIGITS["loss"], data=digits)
    _nothing_launched(job_home)


def test_tfrecords_without_a_feed_function_are_refused(job_home, tmp_path):
    from tests.integration.models import model_zoo_module

    train_glob, _ = model_zoo_module("digits_tfrecord").write_digits_tfrecords(tmp_path)
    with pytest.raises(ContractError, match="TFRecord data needs a feed"):
        edl.train(custom_model, **DIGITS, data=train_glob)
    _nothing_launched(job_home)


def test_a_job_name_in_use_is_refused(job_home, digits):
    (job_home / "jobs" / "taken").mkdir(parents=True)
    with pytest.raises(ValueError, match="already exists"):
        edl.train(custom_model, **DIGITS, data=digits, name="taken")
