"""Evaluation metrics from eval_metrics_fn (model/metrics.py), as workers update them and
the master merges them: per output too, as ElasticDL's `{"output": {"name": metric}}`."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticdl_nb.model.contract import ContractError, ModelContract  # noqa: E402
from elasticdl_nb.model.metrics import (  # noqa: E402
    make_eval_metrics,
    merged_results,
    take_metric_states,
)


def _contract(eval_metrics_fn):
    def loss(labels, predictions):
        labels = tf.cast(labels, tf.float32)
        return keras.losses.binary_crossentropy(labels, predictions["logits"], from_logits=True)

    return ModelContract(
        custom_model=lambda: None,
        loss=loss,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        eval_metrics_fn=eval_metrics_fn,
    )


def per_output():
    return {
        "logits": {
            "accuracy": lambda labels, logits: tf.equal(
                tf.cast(tf.reshape(logits, [-1]) > 0, tf.int64), tf.reshape(labels, [-1])
            ),
        },
        "probs": {"auc": keras.metrics.AUC(name="auc")},
    }


def test_per_output_metrics_see_their_outputs_and_merge_over_workers():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=(200, 1)).astype(np.int64)
    logits = (rng.normal(size=(200, 1)) + 1.5 * (labels - 0.5)).astype(np.float32)
    predictions = {"logits": logits, "probs": 1 / (1 + np.exp(-logits))}
    contract = _contract(per_output)

    # Two workers, half the examples each; the master adds their states up.
    summed: dict = {}
    for half in (slice(0, 100), slice(100, 200)):
        metrics = make_eval_metrics(contract)
        assert sorted(metrics) == ["logits/accuracy", "loss", "probs/auc"]
        for metric in metrics.values():
            metric.update_state(labels[half], {k: v[half] for k, v in predictions.items()})
        for name, state in take_metric_states(metrics).items():
            summed[name] = [a + b for a, b in zip(summed[name], state)] if name in summed else state
    results = merged_results(contract, summed)

    expected_accuracy = np.mean((logits > 0).astype(np.int64) == labels)
    whole_auc = keras.metrics.AUC()
    whole_auc.update_state(labels, predictions["probs"])
    assert results["logits/accuracy"] == pytest.approx(expected_accuracy)
    assert results["probs/auc"] == pytest.approx(float(whole_auc.result()), abs=1e-6)
    assert 0.7 < results["probs/auc"] < 1.0  # (the labels shifted the logits)


def test_mixing_whole_model_metrics_and_per_output_ones_is_refused_by_name():
    mixed = _contract(lambda: {"auc": keras.metrics.AUC(), "logits": {"acc": lambda a, b: a}})
    with pytest.raises(ContractError, match="mixes"):
        make_eval_metrics(mixed)
    not_a_metric = _contract(lambda: {"logits": {"acc": 0.5}})
    with pytest.raises(ContractError, match=r"\['logits'\]\['acc'\] is a float"):
        make_eval_metrics(not_a_metric)
