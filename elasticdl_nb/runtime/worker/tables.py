"""A worker's side of PS-resident embedding tables: Keras `Embedding` layers that hold no
table, and the `TableDef` the PS serves for each.

A table lives on the PS only (issue 17). In a worker, every `keras.layers.Embedding` the
model creates is built with a one-row placeholder instead of its (input_dim, output_dim)
table, so worker memory does not grow with `input_dim`; the runner (`model_runner.py`)
patches its `call` to look ids up in the rows pulled for the step. The layer's Keras
initializer becomes the table's `Initializer` here, where Keras is at hand, so the PS
starts each row from the same distribution without Keras.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import tensorflow as tf

from elasticdl_nb.keras_flavor import keras
from elasticdl_nb.model.contract import ContractError
from elasticdl_nb.runtime.table_def import Initializer, TableDef

_TRUNCATED_STDDEV = 0.87962566103423978  # stddev of a unit normal cut at two deviations


def table_variable(layer):
    """An Embedding layer's table variable: Keras 3 keeps it as `_embeddings` (its
    `embeddings` may be a computed tensor), tf_keras as `embeddings`."""
    table = getattr(layer, "_embeddings", None)
    return table if table is not None else layer.embeddings


@contextmanager
def embeddings_without_tables() -> Iterator[None]:
    """Embedding layers created inside get a one-row placeholder for a table when they are
    built (Keras binds a layer's `build` when the layer is created, so the layers keep it
    after the block ends). A table loaded into one inside (a model captured from the
    notebook, with its weights) is kept aside as the layer's `seed_rows`: the PS start
    the table from it."""
    embedding = keras.layers.Embedding
    original_build, original_load = embedding.build, embedding.load_own_variables

    def build(self, input_shape=None):
        full, self.input_dim = self.input_dim, 1
        try:
            original_build(self, input_shape)
        finally:
            self.input_dim = full

    def load_own_variables(self, store):
        if self.quantization_mode is None and holds_no_table(self) and self.input_dim > 1:
            self.seed_rows = np.asarray(store["0"])
            return
        original_load(self, store)

    embedding.build, embedding.load_own_variables = build, load_own_variables
    try:
        yield
    finally:
        embedding.build, embedding.load_own_variables = original_build, original_load


def holds_no_table(layer) -> bool:
    """Whether `layer` was built with the placeholder (one created outside
    `embeddings_without_tables` holds its whole table)."""
    return int(table_variable(layer).shape[0]) == 1


def lookup_ids(layer, inputs) -> tf.Tensor:
    """The ids of the rows a call of `layer` on `inputs` looks up: flat int64, in order
    (`elasticdl_nb.layers.Embedding` says for itself: it hashes strings)."""
    if hasattr(layer, "lookup_ids"):
        return layer.lookup_ids(inputs)
    return tf.reshape(tf.cast(inputs, tf.int64), [-1])


def assemble(layer, inputs, found: tf.Tensor) -> tf.Tensor:
    """The layer's output, from the rows of `lookup_ids(layer, inputs)` in order."""
    if hasattr(layer, "assemble"):
        return layer.assemble(inputs, found)
    out = tf.reshape(found, tf.concat([tf.shape(inputs), [layer.output_dim]], 0))
    return tf.cast(out, layer.compute_dtype)


def table_def(name: str, layer) -> TableDef:
    """The table an Embedding layer looks its ids up in; ContractError for what a table
    kept row by row on the PS cannot do."""
    if layer.embeddings_regularizer is not None or layer.embeddings_constraint is not None:
        raise ContractError(
            f"Embedding '{name}' has an embeddings_regularizer or embeddings_constraint: "
            "its table lives on the parameter servers, row by row, and a whole-table "
            "penalty or constraint cannot apply there. Remove it (or regularize the "
            "looked-up vectors, e.g. with an activity_regularizer)."
        )
    init = layer.embeddings_initializer
    seed = getattr(init, "seed", None)
    return TableDef(
        name=name,
        dim=int(layer.output_dim),
        dtype=tf.as_dtype(table_variable(layer).dtype).name,  # (tf_keras: a tf.DType)
        input_dim=int(layer.input_dim or 0),
        initializer=_initializer(name, init, int(layer.input_dim or 0), int(layer.output_dim)),
        seed=TableDef.seed_for(name, seed if isinstance(seed, int) else None),
        # (elasticdl_nb.layers.Embedding's; a Keras Embedding keeps every row)
        min_count=getattr(layer, "min_count", 0),
        max_rows=getattr(layer, "max_rows", 0),
        ttl_steps=getattr(layer, "ttl_steps", 0),
    )


def _initializer(name: str, init, input_dim: int, dim: int) -> Initializer:
    inits = keras.initializers
    if isinstance(init, inits.RandomUniform):
        return Initializer("uniform", low=float(init.minval), high=float(init.maxval))
    if isinstance(init, inits.TruncatedNormal):
        return Initializer("truncated_normal", mean=float(init.mean), stddev=float(init.stddev))
    if isinstance(init, inits.RandomNormal):
        return Initializer("normal", mean=float(init.mean), stddev=float(init.stddev))
    if isinstance(init, inits.Zeros):
        return Initializer("constant", value=0.0)
    if isinstance(init, inits.Ones):
        return Initializer("constant", value=1.0)
    if isinstance(init, inits.Constant):
        return Initializer("constant", value=float(init.value))
    if isinstance(init, inits.VarianceScaling) and input_dim:
        fans = {"fan_in": input_dim, "fan_out": dim, "fan_avg": (input_dim + dim) / 2}
        scale = init.scale / max(1.0, fans[init.mode])
        if init.distribution == "uniform":
            limit = math.sqrt(3.0 * scale)
            return Initializer("uniform", low=-limit, high=limit)
        if init.distribution == "untruncated_normal":
            return Initializer("normal", stddev=math.sqrt(scale))
        return Initializer("truncated_normal", stddev=math.sqrt(scale) / _TRUNCATED_STDDEV)
    raise ContractError(
        f"Embedding '{name}' uses the initializer {type(init).__name__}, which cannot start "
        "a table one row at a time (its rows live on the parameter servers): use "
        "'uniform' (the default), 'normal', 'truncated_normal', a Glorot, He or Lecun "
        "initializer, 'zeros', 'ones' or keras.initializers.Constant."
    )
