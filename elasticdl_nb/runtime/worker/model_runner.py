"""The user's Keras model inside a worker, and the compiled steps a worker runs on it.

Embedding tables (every `keras.layers.Embedding`) live on the PS, split by row; a worker
keeps a full-size local copy but only the rows of the current minibatch are fresh. To know
which rows to pull *before* the step, `probe_ids` runs the model in a mode where each
Embedding layer records its input ids and returns zeros: compiled, everything but the
id computation is pruned, so it costs little. Dense variables are pulled whole when the PS
version changed.

Gradients leave as NumPy: dense ones per variable, table ones as (unique row ids, summed
rows) — the sparse `IndexedSlices` Keras produces for lookups, deduplicated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from elasticdl_nb.model.contract import ContractError, ModelContract
from elasticdl_nb.model.metrics import make_eval_metrics
from elasticdl_nb.runtime.compiled_call import CompiledCall


@dataclass
class Gradients:
    loss: float
    dense: dict[str, np.ndarray]
    tables: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (ids, rows)
    next_ids: dict[str, np.ndarray]  # the ids probed for a later minibatch


def _unique_names(variables) -> list[str]:
    names, seen = [], {}
    for var in variables:
        name = var.path
        if name in seen:  # two variables with one path: keep both, distinctly
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 0
        names.append(name)
    return names


class ModelRunner:
    def __init__(self, contract: ModelContract):
        self.contract = contract
        self.model = model = contract.build_model()
        self._tables = [
            layer
            for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.Embedding)
        ]
        self._probing = False
        self._probed: dict[int, list] = {}
        for index, layer in enumerate(self._tables):
            self._patch_embedding(index, layer)
        self.built = False

    def _patch_embedding(self, index: int, layer) -> None:
        original = layer.call
        runner = self

        def call(inputs, *args, **kwargs):
            if runner._probing:
                runner._probed.setdefault(index, []).append(inputs)
                shape = tf.concat([tf.shape(inputs), [layer.output_dim]], 0)
                return tf.zeros(shape, dtype=layer.compute_dtype)
            return original(inputs, *args, **kwargs)

        layer.call = call

    # ------------------------------------------------------------------ building

    def build(self, features: Any) -> None:
        """Create the variables (by calling the model once) and compile the steps."""
        self.model(features, training=False)
        table_vars = [layer.embeddings for layer in self._tables]
        table_ids = {id(v) for v in table_vars}
        dense_vars = [v for v in self.model.trainable_variables if id(v) not in table_ids]
        names = _unique_names(dense_vars + table_vars)
        self.dense_vars = dense_vars
        self.dense_names = names[: len(dense_vars)]
        self.table_vars = table_vars
        self.table_names = names[len(dense_vars) :]
        self.table_rows = {n: int(v.shape[0]) for n, v in zip(self.table_names, table_vars)}
        self.metrics = make_eval_metrics(self.contract)
        self._last_dense = [np.asarray(v.numpy()) for v in dense_vars]
        self._compile()
        self.built = True

    def _compile(self) -> None:
        model, loss_fn = self.model, self.contract.loss
        dense_vars, table_vars = self.dense_vars, self.table_vars
        metrics = list(self.metrics.values())
        tables = self._tables

        def find_ids(features):
            self._probed = {}
            self._probing = True
            try:
                model(features, training=False)
            finally:
                self._probing = False
            out = []
            for index in range(len(tables)):
                seen = [tf.reshape(tf.cast(x, tf.int64), [-1]) for x in self._probed.get(index, [])]
                ids = tf.concat(seen, 0) if seen else tf.zeros([0], tf.int64)
                out.append(tf.unique(ids)[0])
            return out

        @tf.function(reduce_retracing=True)
        def probe(features):
            return find_ids(features)

        def load_into_model(dense_values, ids, rows):
            if dense_values is not None:
                for var, value in zip(dense_vars, dense_values):
                    var.assign(value)
            for var, i, r in zip(table_vars, ids, rows):
                var.value.scatter_update(tf.IndexedSlices(r, i))

        @tf.function(reduce_retracing=True)
        def load(dense_values, ids, rows):
            load_into_model(dense_values, ids, rows)

        def train(features, labels, dense_values, ids, rows, probe_features):
            # Loading the pulled parameters and probing a later minibatch's ids in the
            # same call saves two rounds of Python dispatch per step.
            load_into_model(dense_values, ids, rows)
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = loss_fn(labels, predictions)
                if model.losses:
                    loss = loss + tf.add_n(model.losses)
            grads = tape.gradient(loss, dense_vars + table_vars)
            dense = [
                tf.zeros_like(v.value) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads[: len(dense_vars)], dense_vars)
            ]
            ids_out, rows_out = [], []
            for g, v in zip(grads[len(dense_vars) :], table_vars):
                if g is None:
                    ids_out.append(tf.zeros([0], tf.int64))
                    rows_out.append(tf.zeros([0, v.shape[1]], v.dtype))
                    continue
                if not isinstance(g, tf.IndexedSlices):  # used densely somewhere: keep rows
                    g = tf.IndexedSlices(g, tf.range(tf.shape(g)[0]))
                unique, position = tf.unique(tf.cast(g.indices, tf.int64))
                ids_out.append(unique)
                rows_out.append(tf.math.unsorted_segment_sum(g.values, position, tf.size(unique)))
            return loss, dense, ids_out, rows_out, find_ids(probe_features)

        @tf.function(reduce_retracing=True)
        def evaluate(features, labels):
            predictions = model(features, training=False)
            for metric in metrics:
                metric.update_state(labels, predictions)

        self._probe, self._evaluate, self._load = probe, evaluate, load
        self._train_fn, self._train = train, None  # compiled at the first step (see there)

    # ------------------------------------------------------------------ parameters

    def variable_values(self) -> list[tuple[str, np.ndarray, bool]]:
        """(name, value, is_table) of every trainable variable, for initializing the PS."""
        return [
            (n, np.asarray(v.numpy()), False) for n, v in zip(self.dense_names, self.dense_vars)
        ] + [(n, np.asarray(v.numpy()), True) for n, v in zip(self.table_names, self.table_vars)]

    def probe_ids(self, features: Any) -> dict[str, np.ndarray]:
        """The embedding rows a step on `features` looks up, per table."""
        if not self.table_vars:
            return {}
        return self._checked_ids(self._probe(features))

    def _checked_ids(self, ids) -> dict[str, np.ndarray]:
        out = {}
        for name, table_ids in zip(self.table_names, ids):
            table_ids = table_ids.numpy()
            rows = self.table_rows[name]
            if table_ids.size and (table_ids.min() < 0 or table_ids.max() >= rows):
                bad = table_ids[(table_ids < 0) | (table_ids >= rows)][0]
                raise ContractError(
                    f"Embedding '{name}' looked up id {bad}, outside its "
                    f"{rows} rows: raise input_dim or hash the ids into range."
                )
            out[name] = table_ids
        return out

    def _load_args(
        self,
        dense: Mapping[str, np.ndarray] | None,
        rows: Mapping[str, tuple[np.ndarray, np.ndarray]] | None,
    ):
        dense_values = [dense[n] for n in self.dense_names] if dense else None
        ids, values = [], []
        for name, var in zip(self.table_names, self.table_vars):
            if rows and name in rows:
                ids.append(rows[name][0])
                values.append(rows[name][1])
            else:
                ids.append(np.zeros([0], np.int64))
                values.append(np.zeros([0, var.shape[1]], var.dtype))
        return dense_values, ids, values

    def load(
        self,
        dense: Mapping[str, np.ndarray] | None,
        rows: Mapping[str, tuple[np.ndarray, np.ndarray]] | None,
    ) -> None:
        """Put pulled parameters into the local model."""
        dense_values, ids, values = self._load_args(dense, rows)
        if dense_values is not None:
            self._last_dense = dense_values  # what the model holds now
        self._load(dense_values, ids, values)

    # ------------------------------------------------------------------ steps

    def _compile_train(self, features: Any, labels: Any) -> None:
        """Compile the train step for the shapes of this job's minibatches.

        One input signature, with only the batch dimension left open, means one trace
        for the whole job; without it TensorFlow retraced 5-6 times in a worker's first
        steps (about a second each time a worker starts). Called through `CompiledCall`,
        which skips tf.function's per-call argument binding."""

        def batch_spec(x):
            x = tf.convert_to_tensor(x)
            return tf.TensorSpec([None, *x.shape[1:]], x.dtype)

        feature_spec = tf.nest.map_structure(batch_spec, features)
        signature = [
            feature_spec,
            tf.nest.map_structure(batch_spec, labels),
            [tf.TensorSpec(v.shape, v.dtype) for v in self.dense_vars],
            [tf.TensorSpec([None], tf.int64) for _ in self.table_vars],
            [tf.TensorSpec([None, v.shape[1]], v.dtype) for v in self.table_vars],
            feature_spec,
        ]
        self._train = CompiledCall(self._train_fn, signature, "train step")

    def train_step(
        self,
        features: Any,
        labels: Any,
        dense: Mapping[str, np.ndarray] | None = None,
        rows: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
        probe_features: Any = None,
    ) -> Gradients:
        """Load the pulled parameters (if any), then one forward and backward pass; with
        `probe_features`, also the ids a later step needs (in `Gradients.next_ids`)."""
        if self._train is None:
            self._compile_train(features, labels)
        dense_values, ids, values = self._load_args(dense, rows)
        if dense_values is None:  # nothing new: the same values again keep one signature
            dense_values = self._last_dense
        self._last_dense = dense_values
        wants_ids = probe_features is not None and bool(self.table_vars)
        if not wants_ids:  # an empty minibatch probes nothing
            probe_features = tf.nest.map_structure(lambda x: np.asarray(x)[:0], features)
        loss, dense_grads, grad_ids, grad_rows, probed = self._train(
            features, labels, dense_values, ids, values, probe_features
        )
        return Gradients(
            float(loss),
            {n: g.numpy() for n, g in zip(self.dense_names, dense_grads)},
            {n: (i.numpy(), r.numpy()) for n, i, r in zip(self.table_names, grad_ids, grad_rows)},
            self._checked_ids(probed) if wants_ids else {},
        )

    def eval_step(self, features: Any, labels: Any) -> None:
        self._evaluate(features, labels)
