"""The user's Keras model inside a worker, and the compiled steps a worker runs on it.

Embedding tables (every `keras.layers.Embedding`) live on the PS only: a worker holds no
table (`tables.py` builds each layer with a one-row placeholder), only the rows of the
minibatches in flight. A step is given each table's pulled (sorted ids, rows) as
arguments, and the layer finds its inputs' rows among them by binary search. To know which
rows to pull *before* the step, `probe_ids` runs the model in a mode where each Embedding
layer records its input ids and returns zeros: compiled, everything but the id
computation is pruned, so it costs little. Dense variables are pulled whole when the PS
version changed.

Gradients leave as NumPy: dense ones per variable, table ones as (the pulled ids, the
summed gradient of each) — the gradient with respect to the pulled rows themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from elasticdl_nb.keras_flavor import keras, variable_name
from elasticdl_nb.layers.embedding import whole_tables
from elasticdl_nb.model.contract import ContractError, ModelContract, call_model
from elasticdl_nb.model.metrics import make_eval_metrics
from elasticdl_nb.runtime.compiled_call import CompiledCall
from elasticdl_nb.runtime.table_def import initial_rows
from elasticdl_nb.runtime.worker.tables import (
    assemble,
    embeddings_without_tables,
    holds_no_table,
    lookup_ids,
    table_def,
    table_variable,
)

log = logging.getLogger("elasticdl_nb.worker")


@dataclass
class Gradients:
    loss: float
    dense: dict[str, np.ndarray]
    tables: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (ids, rows)
    next_ids: dict[str, np.ndarray]  # the ids probed for a later minibatch


def _unique_names(variables) -> list[str]:
    names, seen = [], {}
    for var in variables:
        name = variable_name(var)
        if name in seen:  # two variables with one path: keep both, distinctly
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 0
        names.append(name)
    return names


def _no_examples(x: Any) -> Any:
    """`x` with no examples (its first dimension 0), of the same kind."""
    if isinstance(x, tf.SparseTensor):
        return tf.sparse.slice(x, [0] * x.shape.rank, [0, *x.dense_shape[1:].numpy()])
    return np.asarray(x)[:0]


class ModelRunner:
    def __init__(self, contract: ModelContract):
        self.contract = contract
        with embeddings_without_tables():
            self.model = model = contract.build_model()
        self._tables = [
            layer
            for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.Embedding)
        ]
        self._probing = False
        self._probed: dict[int, list] = {}
        self._serving: list | None = None  # per table (sorted ids, rows) during a step
        for index, layer in enumerate(self._tables):
            self._patch_embedding(index, layer)
        self.built = False

    def _patch_embedding(self, index: int, layer) -> None:
        runner = self

        def call(inputs, *args, **kwargs):
            ids = lookup_ids(layer, inputs)
            if runner._probing:
                runner._probed.setdefault(index, []).append(ids)
                return assemble(layer, inputs, tf.zeros([tf.size(ids), layer.output_dim]))
            if runner._serving is None:
                raise RuntimeError(
                    "an Embedding's rows are on the parameter servers: call the model "
                    "through ModelRunner's steps, which bring them"
                )
            pulled_ids, rows = runner._serving[index]
            return assemble(layer, inputs, tf.gather(rows, tf.searchsorted(pulled_ids, ids)))

        layer.call = call

    @contextmanager
    def _rows_in_use(self, ids, rows) -> Iterator[None]:
        """Serve these pulled rows to the Embedding layers while the model runs (at trace
        time inside a compiled step: the tensors are then the step's arguments)."""
        self._serving = list(zip(ids, rows))
        try:
            yield
        finally:
            self._serving = None

    # ------------------------------------------------------------------ building

    def build(self, features: Any) -> None:
        """Create the variables (by calling the model once) and compile the steps."""
        self._probing = True  # the first call builds the layers: no rows needed for that
        try:
            call_model(self.model, features, training=False)
        finally:
            self._probing = False
        placeholders = {id(table_variable(layer)) for layer in self._tables}
        dense_vars = [v for v in self.model.trainable_variables if id(v) not in placeholders]
        names = _unique_names(dense_vars + [table_variable(layer) for layer in self._tables])
        self.dense_vars = dense_vars
        self.dense_names = names[: len(dense_vars)]
        self.table_names = names[len(dense_vars) :]
        self.table_defs = [
            table_def(name, layer) for name, layer in zip(self.table_names, self._tables)
        ]
        # Tables a captured model brought (its trained or loaded values): the PS start
        # from them. Given to the PS once (`take_table_seeds`), then dropped here.
        self._seeds = {
            name: layer.seed_rows
            for name, layer in zip(self.table_names, self._tables)
            if getattr(layer, "seed_rows", None) is not None
        }
        for layer in self._tables:
            layer.seed_rows = None
        for name, layer in zip(self.table_names, self._tables):
            if not holds_no_table(layer):
                log.warning(
                    "Embedding '%s' was created outside custom_model() and holds its whole "
                    "table in this worker; its rows are still trained on the PS",
                    name,
                )
        self.metrics = make_eval_metrics(self.contract)
        self._last_dense = [np.asarray(v.numpy()) for v in dense_vars]
        self._compile()
        self.built = True

    def _compile(self) -> None:
        model, loss_fn = self.model, self.contract.loss
        dense_vars, defs = self.dense_vars, self.table_defs
        metrics = list(self.metrics.values())

        def find_ids(features):
            self._probed = {}
            self._probing = True
            try:
                call_model(model, features, training=False)
            finally:
                self._probing = False
            out = []
            for index in range(len(defs)):
                seen = self._probed.get(index, [])
                ids = tf.concat(seen, 0) if seen else tf.zeros([0], tf.int64)
                out.append(tf.unique(ids)[0])
            return out

        @tf.function(reduce_retracing=True)
        def probe(features):
            return find_ids(features)

        def load_dense(dense_values):
            for var, value in zip(dense_vars, dense_values):
                var.assign(value)

        @tf.function(reduce_retracing=True)
        def load(dense_values):
            load_dense(dense_values)

        def train(features, labels, dense_values, ids, rows, probe_features):
            # Loading the pulled parameters and probing a later minibatch's ids in the
            # same call saves two rounds of Python dispatch per step.
            load_dense(dense_values)
            with tf.GradientTape() as tape, self._rows_in_use(ids, rows):
                tape.watch(rows)
                predictions = call_model(model, features, training=True)
                loss = loss_fn(labels, predictions)
                if model.losses:
                    loss = loss + tf.add_n(model.losses)
            grads = tape.gradient(loss, dense_vars + list(rows))
            dense = [
                tf.zeros_like(v.value) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads[: len(dense_vars)], dense_vars)
            ]
            ids_out, rows_out = [], []
            for g, table_ids, table_rows, d in zip(grads[len(dense_vars) :], ids, rows, defs):
                if g is None:  # the table was not used
                    ids_out.append(tf.zeros([0], tf.int64))
                    rows_out.append(tf.zeros([0, d.dim], d.dtype))
                elif isinstance(g, tf.IndexedSlices):  # one slice per lookup: sum per id
                    ids_out.append(table_ids)
                    rows_out.append(
                        tf.math.unsorted_segment_sum(g.values, g.indices, tf.shape(table_rows)[0])
                    )
                else:
                    ids_out.append(table_ids)
                    rows_out.append(g)
            return loss, dense, ids_out, rows_out, find_ids(probe_features)

        @tf.function(reduce_retracing=True)
        def evaluate(features, labels, ids, rows):
            with self._rows_in_use(ids, rows):
                predictions = call_model(model, features, training=False)
            for metric in metrics:
                metric.update_state(labels, predictions)

        @tf.function(reduce_retracing=True)
        def forward(features, ids, rows):
            with self._rows_in_use(ids, rows):
                return call_model(model, features, training=False)

        self._probe, self._evaluate, self._load, self._forward = probe, evaluate, load, forward
        self._train_fn, self._train = train, None  # compiled at the first step (see there)

    # ------------------------------------------------------------------ parameters

    def variable_values(self) -> list[tuple[str, np.ndarray]]:
        """(name, value) of every dense trainable variable, for initializing the PS."""
        return [(n, np.asarray(v.numpy())) for n, v in zip(self.dense_names, self.dense_vars)]

    def take_table_seeds(self) -> dict[str, np.ndarray]:
        """The whole tables a captured model brought, by table name; empty after the
        first call (the PS keep them from then on)."""
        seeds, self._seeds = self._seeds, {}
        return seeds

    def probe_ids(self, features: Any) -> dict[str, np.ndarray]:
        """The embedding rows a step on `features` looks up, per table."""
        if not self.table_defs:
            return {}
        return self._checked_ids(self._probe(features))

    def _checked_ids(self, ids) -> dict[str, np.ndarray]:
        out = {}
        for d, table_ids in zip(self.table_defs, ids):
            table_ids = table_ids.numpy()
            rows = d.input_dim
            if rows and table_ids.size and (table_ids.min() < 0 or table_ids.max() >= rows):
                bad = table_ids[(table_ids < 0) | (table_ids >= rows)][0]
                raise ContractError(
                    f"Embedding '{d.name}' looked up id {bad}, outside its "
                    f"{rows} rows: raise input_dim or hash the ids into range."
                )
            out[d.name] = table_ids
        return out

    def initial_rows(self, ids: Mapping[str, np.ndarray]) -> dict[str, tuple]:
        """The rows `ids` start as, as a PS that has trained none of them serves them (for
        running the model before any PS is up: the preflight check)."""
        return {d.name: (ids[d.name], initial_rows(d, ids[d.name])) for d in self.table_defs}

    def _rows_args(self, rows: Mapping[str, tuple[np.ndarray, np.ndarray]] | None):
        """Per table: pulled ids sorted (the layers search them) and their rows."""
        ids, values = [], []
        for d in self.table_defs:
            if rows and d.name in rows:
                table_ids, table_rows = rows[d.name]
                order = np.argsort(table_ids, kind="stable")
                ids.append(np.ascontiguousarray(table_ids[order]))
                values.append(np.ascontiguousarray(table_rows[order]))
            else:
                ids.append(np.zeros([0], np.int64))
                values.append(np.zeros([0, d.dim], d.dtype))
        return ids, values

    def load(self, dense: Mapping[str, np.ndarray] | None) -> None:
        """Put pulled dense variables into the local model (tables have no local copy)."""
        if dense:
            self._last_dense = [dense[n] for n in self.dense_names]  # what the model holds now
            self._load(self._last_dense)

    def forward(self, features: Any, rows: Mapping[str, tuple[np.ndarray, np.ndarray]]):
        """The model's predictions on `features`, its Embeddings reading `rows`."""
        return self._forward(features, *self._rows_args(rows))

    def full_model(
        self, features: Any, dense: Mapping[str, np.ndarray], tables: Mapping[str, np.ndarray]
    ):
        """A model with whole tables (for export): built afresh from `custom_model()`, its
        dense variables set to `dense`, each Embedding's table to `tables`' array, and its
        non-trainable state (normalization statistics) to this worker's."""
        with whole_tables():  # (ElasticDL's Embedding too: a table like Keras's)
            model = self.contract.build_model()
        call_model(model, features, training=False)
        layers = [
            layer
            for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.Embedding)
        ]
        table_ids = {id(layer.embeddings) for layer in layers}
        dense_vars = [v for v in model.trainable_variables if id(v) not in table_ids]
        for var, name in zip(dense_vars, self.dense_names, strict=True):
            var.assign(dense[name])
        for layer, name in zip(layers, self.table_names, strict=True):
            layer.embeddings.assign(tables[name])
        mine = self.model.non_trainable_variables
        for var, value in zip(model.non_trainable_variables, mine, strict=True):
            var.assign(value)
        return model

    # ------------------------------------------------------------------ steps

    def prepare_train(self, features: Any, labels: Any) -> None:
        """Trace the train step for minibatches like this one, if it is not yet."""
        if self._train is None:
            self._compile_train(features, labels)

    def _compile_train(self, features: Any, labels: Any) -> None:
        """Compile the train step for the shapes of this job's minibatches.

        One input signature, with only the batch dimension left open, means one trace
        for the whole job; without it TensorFlow retraced 5-6 times in a worker's first
        steps (about a second each time a worker starts). Called through `CompiledCall`,
        which skips tf.function's per-call argument binding."""

        def batch_spec(x):
            if isinstance(x, tf.SparseTensor):  # (a feed's sparse features)
                return tf.SparseTensorSpec([None, *x.shape[1:]], x.dtype)
            x = tf.convert_to_tensor(x)
            return tf.TensorSpec([None, *x.shape[1:]], x.dtype)

        feature_spec = tf.nest.map_structure(batch_spec, features)
        signature = [
            feature_spec,
            tf.nest.map_structure(batch_spec, labels),
            [tf.TensorSpec(v.shape, v.dtype) for v in self.dense_vars],
            [tf.TensorSpec([None], tf.int64) for _ in self.table_defs],
            [tf.TensorSpec([None, d.dim], d.dtype) for d in self.table_defs],
            feature_spec,
        ]
        self._train = CompiledCall(self._train_fn, signature, "train step")

    def warm_up(self, features: Any, labels: Any) -> None:
        """Run the train step once on a minibatch, with the model's own values and zero
        rows, and throw its gradients away. TensorFlow's first runs of a traced function
        are slow (a CTR worker's first task took 0.26-0.30 s against 0.02-0.03 s), and
        with an epoch's last task in a new worker's hands every other worker waited for
        it (bench/profiles.md, section 6). The user's model and loss run once more for
        it, on one minibatch; nothing is pushed."""
        probed = self.probe_ids(features)
        rows = {
            d.name: (probed[d.name], np.zeros((len(probed[d.name]), d.dim), d.dtype))
            for d in self.table_defs
        }
        self.train_step(features, labels, dict(self.variable_values()), rows)

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
        self.prepare_train(features, labels)
        if dense:
            self._last_dense = [dense[n] for n in self.dense_names]
        # (nothing new: the same values again keep one signature)
        dense_values = self._last_dense
        ids, values = self._rows_args(rows)
        wants_ids = probe_features is not None and bool(self.table_defs)
        if not wants_ids:  # an empty minibatch probes nothing
            probe_features = tf.nest.map_structure(_no_examples, features)
        loss, dense_grads, grad_ids, grad_rows, probed = self._train(
            features, labels, dense_values, ids, values, probe_features
        )
        return Gradients(
            float(loss),
            {n: g.numpy() for n, g in zip(self.dense_names, dense_grads)},
            {n: (i.numpy(), r.numpy()) for n, i, r in zip(self.table_names, grad_ids, grad_rows)},
            self._checked_ids(probed) if wants_ids else {},
        )

    def eval_step(
        self, features: Any, labels: Any, rows: Mapping[str, tuple[np.ndarray, np.ndarray]]
    ) -> None:
        """Update the evaluation metrics on a minibatch, its Embeddings reading `rows`."""
        self._evaluate(features, labels, *self._rows_args(rows))
