"""ElasticDL's `Embedding` layer, for elasticdl-nb jobs: a table with no size.

`Embedding(output_dim)` looks up ids of any int64 value, or strings (hashed to int64 with
TensorFlow's fingerprint hash, the same in every process), in a table that lives on the
parameter servers only: each PS creates the rows of the ids it owns on first touch, from
the layer's initializer. With a `combiner` ("sum", "mean" or "sqrtn"), a `tf.SparseTensor`
of ids (one row of ids per example) gives one combined vector per example, as ElasticDL's
did; dense inputs give one vector per id, as `keras.layers.Embedding` does.

Beyond ElasticDL, what the table keeps (each PS applies it to the ids it owns):
`min_count` admits an id to a trained row only once it has been seen in that many
minibatches (before that it reads its initial row and its gradient is dropped);
`max_rows` caps the rows across the PS, least recently updated evicted first; `ttl_steps`
evicts rows no update reached for that many versions of their PS.

The layer is a `keras.layers.Embedding` with a one-row placeholder for a table, so a
worker runs it as it runs any Keras Embedding (runtime/worker/tables.py): `lookup_ids`
says which rows an input needs, `assemble` shapes the rows found into the output. Called
outside a job it has no rows to give, and says so.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import tensorflow as tf

from elasticdl_nb.keras_flavor import keras

COMBINERS = ("sum", "mean", "sqrtn")
HASH_BUCKETS = 2**63 - 1  # strings become ids in [0, 2^63 - 1)


class Embedding(keras.layers.Embedding):
    def __init__(
        self,
        output_dim: int,
        input_dim: int | None = None,
        embeddings_initializer="uniform",
        mask_zero: bool = False,
        input_length: int | None = None,
        combiner: str | None = None,
        min_count: int = 0,
        max_rows: int = 0,
        ttl_steps: int = 0,
        embedding_service_endpoint=None,  # ElasticDL's old Redis service: not needed here
        whole_table: bool | None = None,
        **kwargs,
    ):
        if combiner is not None and combiner not in COMBINERS:
            raise ValueError(f"combiner must be one of {COMBINERS} or None, not {combiner!r}")
        if input_dim is not None and (not isinstance(input_dim, int) or input_dim <= 0):
            raise ValueError(f"input_dim must be a positive int or None, not {input_dim!r}")
        if not isinstance(min_count, int) or not 0 <= min_count <= 255:
            raise ValueError(f"min_count must be an int from 0 to 255, not {min_count!r}")
        for name, value in (("max_rows", max_rows), ("ttl_steps", ttl_steps)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0 (0: no limit), not {value!r}")
        super().__init__(
            input_dim or 1,
            output_dim,
            embeddings_initializer=embeddings_initializer,
            mask_zero=mask_zero,
            **kwargs,
        )
        self.input_dim = input_dim  # None: ids of any int64 value
        self.input_length = input_length
        self.combiner = combiner
        self.min_count, self.max_rows, self.ttl_steps = min_count, max_rows, ttl_steps
        self.whole_table = _WHOLE_TABLES.on if whole_table is None else whole_table
        if self.whole_table and input_dim is None:
            raise ValueError(
                f"Embedding '{self.name}' has no input_dim, so no whole table: its rows are "
                "exported as (id, vector) files (elasticdl_nb.load_embeddings reads them)."
            )

    def build(self, input_shape=None):
        if self.whole_table:  # an exported model's: a Keras Embedding's table
            self._keep(
                self.add_weight(
                    shape=(self.input_dim, self.output_dim),
                    initializer=self.embeddings_initializer,
                    name="embeddings",
                    trainable=True,
                )
            )
            return
        # The table is on the parameter servers; this stands in for it in the model.
        self._keep(
            self.add_weight(
                shape=(1, self.output_dim), initializer="zeros", name="embeddings", trainable=True
            )
        )

    def _keep(self, table) -> None:
        self._embeddings = table
        if not isinstance(getattr(type(self), "embeddings", None), property):
            self.embeddings = (
                table  # (tf_keras's Embedding: an attribute; Keras 3's reads _embeddings)
            )

    def call(self, inputs):
        if self.whole_table:
            return self.assemble(inputs, tf.gather(self._embeddings, self.lookup_ids(inputs)))
        if _building_symbolically():  # (tf_keras: outputs of the right shape, no rows)
            ids = self.lookup_ids(inputs)
            return self.assemble(inputs, tf.gather(self._embeddings, tf.zeros_like(ids)))
        raise RuntimeError(
            f"Embedding '{self.name}' keeps its rows on the parameter servers of an "
            "elasticdl-nb job, so it runs only inside one: train the model with "
            "%%elasticdl or elasticdl_nb.train()."
        )

    # ------------------------------------------------------------------ inside a job

    def lookup_ids(self, inputs) -> tf.Tensor:
        """The ids of the rows `inputs` needs, flat, in input order (strings hashed)."""
        values = inputs.values if isinstance(inputs, tf.SparseTensor) else inputs
        if values.dtype == tf.string:
            ids = tf.strings.to_hash_bucket_fast(values, HASH_BUCKETS)
        else:
            ids = tf.cast(values, tf.int64)
        return tf.reshape(ids, [-1])

    def assemble(self, inputs, found: tf.Tensor) -> tf.Tensor:
        """The layer's output from `found`, the rows of `lookup_ids(inputs)` in order."""
        if not isinstance(inputs, tf.SparseTensor):
            shape = tf.concat([tf.shape(inputs, out_type=tf.int32), [self.output_dim]], 0)
            return tf.cast(tf.reshape(found, shape), self.compute_dtype)
        if self.combiner is None:
            raise ValueError(
                f"Embedding '{self.name}' got a tf.SparseTensor: give it a combiner "
                f"({', '.join(COMBINERS)}) to say how an example's rows are combined."
            )
        example = inputs.indices[:, 0]
        examples = tf.cast(inputs.dense_shape[0], tf.int32)
        combined = tf.math.unsorted_segment_sum(found, example, examples)
        if self.combiner != "sum":
            counts = tf.math.unsorted_segment_sum(
                tf.ones_like(example, found.dtype), example, examples
            )
            counts = tf.maximum(counts, 1.0)[:, None]
            combined /= counts if self.combiner == "mean" else tf.sqrt(counts)
        return tf.cast(combined, self.compute_dtype)

    # ------------------------------------------------------------------ Keras

    def compute_output_spec(self, inputs):
        if getattr(inputs, "sparse", False):
            return keras.KerasTensor((inputs.shape[0], self.output_dim), self.compute_dtype)
        return keras.KerasTensor((*inputs.shape, self.output_dim), self.compute_dtype)

    def compute_mask(self, inputs, mask=None):
        if isinstance(inputs, tf.SparseTensor) or getattr(inputs, "sparse", False):
            return None
        if inputs.dtype == tf.string:
            return tf.not_equal(inputs, "") if self.mask_zero else None
        return super().compute_mask(inputs, mask)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            input_dim=self.input_dim,
            input_length=self.input_length,
            combiner=self.combiner,
            min_count=self.min_count,
            max_rows=self.max_rows,
            ttl_steps=self.ttl_steps,
            whole_table=self.whole_table,
        )
        return config


class _WholeTables(threading.local):
    on = False


_WHOLE_TABLES = _WholeTables()


@contextmanager
def whole_tables() -> Iterator[None]:
    """Embedding layers created inside hold their whole table (`input_dim` rows), as a
    Keras Embedding does: the model a job exports, which then runs and loads anywhere (its
    config says so). Elsewhere a layer's rows are on the parameter servers."""
    _WHOLE_TABLES.on = True
    try:
        yield
    finally:
        _WHOLE_TABLES.on = False


def _building_symbolically() -> bool:
    """Whether a functional model is being built: Keras 2 (tf_keras) calls each layer on
    placeholders in a scratch graph of its own, '<layer>_scratch_graph' (Keras 3 asks for
    output specs instead)."""
    graph = tf.compat.v1.get_default_graph()
    return not tf.executing_eagerly() and graph.name.endswith("_scratch_graph")
