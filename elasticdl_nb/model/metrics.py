"""Evaluation metrics from `eval_metrics_fn()`, and merging their states across workers.

ElasticDL's `eval_metrics_fn` returns a dict whose values are Keras metrics or functions
`fn(labels, predictions)` giving per-example values (averaged, as ElasticDL did). Workers
evaluate their tasks and send the metrics' state variables; the master adds the states up
and reads the result. Adding is right for Keras' counting metrics (Mean and its wrappers,
accuracy, AUC, precision, recall, cross-entropies): their states are sums and counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from elasticdl_nb.model.contract import ContractError, ModelContract

LOSS_METRIC = "loss"


def make_eval_metrics(contract: ModelContract) -> dict[str, Any]:
    """Fresh metric objects for an evaluation; always includes the loss."""
    import keras
    import tensorflow as tf

    def mean_of(fn):
        return lambda labels, predictions: tf.cast(fn(labels, predictions), tf.float32)

    metrics: dict[str, Any] = {
        LOSS_METRIC: keras.metrics.MeanMetricWrapper(mean_of(contract.loss), name=LOSS_METRIC)
    }
    given: Mapping[str, Any] = contract.eval_metrics_fn() if contract.eval_metrics_fn else {}
    if not isinstance(given, Mapping):
        raise ContractError(
            "eval_metrics_fn() must return a dict of name -> Keras metric or "
            f"function(labels, predictions); got {type(given).__name__}."
        )
    for name, metric in given.items():
        if isinstance(metric, keras.metrics.Metric):
            metrics[name] = metric
        elif callable(metric):
            metrics[name] = keras.metrics.MeanMetricWrapper(mean_of(metric), name=name)
        else:
            raise ContractError(
                f"eval_metrics_fn()['{name}'] is a {type(metric).__name__}; "
                "use a Keras metric or a function(labels, predictions)."
            )
    return metrics


def metric_states(metrics: Mapping[str, Any]) -> dict[str, list[np.ndarray]]:
    return {name: [np.asarray(v.numpy()) for v in m.variables] for name, m in metrics.items()}


def take_metric_states(metrics: Mapping[str, Any]) -> dict[str, list[np.ndarray]]:
    """The metrics' states since the last call (an evaluation task's), then reset them."""
    states = metric_states(metrics)
    for metric in metrics.values():
        metric.reset_state()
    return states


def merged_results(contract: ModelContract, states: Mapping[str, list[np.ndarray]]) -> dict:
    """Metric values from states already summed over all evaluation tasks."""
    results = {}
    for name, metric in make_eval_metrics(contract).items():
        if name not in states:
            continue
        for var, value in zip(metric.variables, states[name], strict=True):
            var.assign(np.asarray(value).astype(var.dtype))
        results[name] = float(np.asarray(metric.result()).mean())
    return results
