"""Evaluation metrics from `eval_metrics_fn()`, and merging their states across workers.

ElasticDL's `eval_metrics_fn` returns a dict whose values are Keras metrics or functions
`fn(labels, predictions)` giving per-example values (averaged, as ElasticDL did), or, for
a model with several outputs, such a dict per output name (each output's predictions
against the same labels, as ElasticDL did; named "<output>/<metric>" here). Workers
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


class OneOutput:
    """A metric of one output of a model with several (ElasticDL's per-output
    `eval_metrics_fn`): given every output's predictions, it is updated with `output`'s.
    It reads, resets and merges as the metric it holds."""

    def __init__(self, metric: Any, output: str):
        self.metric, self.output = metric, output

    def update_state(self, labels, predictions):
        if isinstance(predictions, Mapping):  # (a model of one output: its predictions)
            predictions = predictions[self.output]
        return self.metric.update_state(labels, predictions)

    def result(self):
        return self.metric.result()

    def reset_state(self) -> None:
        self.metric.reset_state()

    @property
    def variables(self) -> list:
        return self.metric.variables


class MeanOf(OneOutput):
    """The mean of `fn(labels, predictions)`'s values (a loss, or ElasticDL's per-example
    metric functions), as Keras's MeanMetricWrapper takes it, except that predictions
    go to `fn` as the model gave them: tf_keras's wrapper casts them to a tensor, which a
    model with a dict of outputs is not."""

    def __init__(self, mean: Any, fn: Any):
        super().__init__(mean, "")
        self.fn = fn

    def update_state(self, labels, predictions):
        import tensorflow as tf

        return self.metric.update_state(tf.cast(self.fn(labels, predictions), tf.float32))


def make_eval_metrics(contract: ModelContract) -> dict[str, Any]:
    """Fresh metric objects for an evaluation; always includes the loss. Per output
    (`{"logits": {"auc": ...}}`), a metric is named "<output>/<metric>"."""

    from elasticdl_nb.keras_flavor import keras

    def metric_of(name: str, metric: Any, where: str):
        if isinstance(metric, keras.metrics.Metric):
            return metric
        if callable(metric):
            return MeanOf(keras.metrics.Mean(name=name), metric)
        raise ContractError(
            f"eval_metrics_fn(){where} is a {type(metric).__name__}; use a Keras metric or "
            "a function(labels, predictions), or per output a dict of them "
            '({"output name": {"auc": keras.metrics.AUC()}}).'
        )

    metrics: dict[str, Any] = {LOSS_METRIC: MeanOf(keras.metrics.Mean(LOSS_METRIC), contract.loss)}
    given: Mapping[str, Any] = contract.eval_metrics_fn() if contract.eval_metrics_fn else {}
    if not isinstance(given, Mapping):
        raise ContractError(
            "eval_metrics_fn() must return a dict of name -> Keras metric or "
            f"function(labels, predictions); got {type(given).__name__}."
        )
    per_output = [isinstance(value, Mapping) for value in given.values()]
    if any(per_output) and not all(per_output):
        raise ContractError(
            "eval_metrics_fn() mixes metrics of the whole model with per-output dicts: "
            'return either {"name": metric, ...} or {"output name": {"name": metric}, ...}.'
        )
    for name, value in given.items():
        if not isinstance(value, Mapping):
            metrics[name] = metric_of(name, value, f"['{name}']")
            continue
        for metric_name, metric in value.items():
            where = f"['{name}']['{metric_name}']"
            metrics[f"{name}/{metric_name}"] = OneOutput(
                metric_of(metric_name, metric, where), name
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
            var.assign(np.asarray(value).astype(getattr(var.dtype, "as_numpy_dtype", var.dtype)))
        results[name] = float(np.asarray(metric.result()).mean())
    return results
