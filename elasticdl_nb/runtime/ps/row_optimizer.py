"""The job's Keras optimizer applied to just the embedding rows a minibatch touched.

Tables live in numpy (`tables/table.py`): a row's state is its vector and its optimizer
slots side by side. A step hands `update` the states of the rows it touches and their
gradients; a second instance of the job's optimizer, built on small *proxy* variables
(one per table, `capacity` rows each), takes the states into the proxies and their slots,
applies the gradients and gives the new states back, inside the PS's one compiled step.

This is the optimizer's own update rule, applied lazily: rows without a gradient are left
alone (for SGD and Adagrad that is exactly the dense result; for momentum and Adam it is
"lazy" Adam, as TensorFlow's sparse updates have always been). Optimizers whose state is
not one value per parameter (Adafactor) cannot update a table row by row: `supports()`
says so, and the store refuses them with the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from elasticdl_nb.keras_flavor import optimizer_variables


def _capacity(rows: int, index: int) -> int:
    # Proxies get distinct first dimensions, so each optimizer slot maps to its table
    # by shape alone.
    return max(64, 1 << (max(rows, 1) - 1).bit_length()) + index


class RowOptimizer:
    def __init__(
        self,
        make_optimizer: Callable[[], object],
        shapes: list[tuple[int, str]],
        expected_rows: int = 64,
    ):
        """`shapes`: (dim, dtype) per table; `expected_rows`: rows a step is expected to
        touch per table (the proxies' first size; they grow when a step touches more)."""
        self._make_optimizer = make_optimizer
        self.shapes = shapes
        self.scalars: list[np.ndarray] = []  # iteration, learning rate, ... carried over
        self.generation = 0  # bumped by every (re)build of the proxies
        self._build([expected_rows] * len(shapes))
        # What a new row's slots start as, per table: [slots, dim].
        self.fresh_slots = [
            np.stack([s.numpy()[0] for s in slots]) if slots else np.zeros((0, dim), dtype)
            for slots, (dim, dtype) in zip(self._proxy_slots, shapes)
        ]

    @staticmethod
    def supports(make_optimizer: Callable[[], object]) -> bool:
        probe = make_optimizer()
        a, b = tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([4, 2]))
        probe.build([a, b])
        return all(tuple(v.shape) in ((), (3, 2), (4, 2)) for v in optimizer_variables(probe))

    def _build(self, wanted: list[int]) -> None:
        """(Re)build proxies of at least `wanted` rows per table, keeping the scalars."""
        self.capacities = [_capacity(n, i) for i, n in enumerate(wanted)]
        self.proxies = [
            tf.Variable(tf.zeros([c, dim], dtype), trainable=False)
            for c, (dim, dtype) in zip(self.capacities, self.shapes)
        ]
        optimizer = self._make_optimizer()
        optimizer.build(self.proxies)
        by_rows = {c: i for i, c in enumerate(self.capacities)}
        proxy_slots: list[list[tf.Variable]] = [[] for _ in self.shapes]
        scalars = []
        for var in optimizer_variables(optimizer):
            if len(var.shape) == 0:
                scalars.append(var)
            else:
                proxy_slots[by_rows[int(var.shape[0])]].append(var)
        for var, value in zip(scalars, self.scalars):  # a rebuild keeps the iteration count
            var.assign(value)
        self.optimizer, self._proxy_slots, self._scalars = optimizer, proxy_slots, scalars
        self.generation += 1  # the variables a compiled caller captured are gone

    def ensure_capacity(self, lengths: list[int]) -> None:
        """Grow the proxies if a step touches more rows than they hold."""
        if any(n > c - t for t, (n, c) in enumerate(zip(lengths, self.capacities))):
            self.scalars = [v.numpy() for v in self._scalars]
            self._build([max(n, c - t) for t, (n, c) in enumerate(zip(lengths, self.capacities))])

    def update(self, states_per_table, grads_per_table) -> list:
        """Graph code (call it inside a tf.function, after `ensure_capacity`): the new
        states of the rows whose states and gradients are given, per table."""
        grads = []
        for t, (states, grad) in enumerate(zip(states_per_table, grads_per_table)):
            dim = self.shapes[t][0]
            pad = [[0, self.capacities[t] - tf.shape(states)[0]], [0, 0]]
            self.proxies[t].assign(tf.pad(states[:, :dim], pad))
            for k, proxy in enumerate(self._proxy_slots[t], start=1):
                proxy.assign(tf.pad(states[:, k * dim : (k + 1) * dim], pad))
            grads.append(tf.pad(grad, pad))
        self.optimizer.apply_gradients(zip(grads, self.proxies))
        out = []
        for t, states in enumerate(states_per_table):
            n = tf.shape(states)[0]
            parts = [self.proxies[t][:n]] + [proxy[:n] for proxy in self._proxy_slots[t]]
            out.append(tf.concat(parts, axis=1))
        return out

    def rows_wanted(self) -> list[int]:
        """The row counts the proxies were grown for (`ensure_capacity` takes them back)."""
        return [c - t for t, c in enumerate(self.capacities)]

    # ------------------------------------------------------------------ checkpoints

    def state(self) -> list[np.ndarray]:
        """The optimizer's scalars (its slots are in the tables' rows)."""
        return [v.numpy() for v in self._scalars]

    def restore(self, values: list[np.ndarray]) -> None:
        for var, value in zip(self._scalars, values, strict=True):
            var.assign(value)
