"""The job's Keras optimizer applied to just the embedding rows a minibatch touched.

Applied to a whole table, a Keras optimizer turns a sparse gradient dense and updates
every row: milliseconds per step for a 10,000-row table, most of a PS's time. Instead,
a second instance of the same optimizer is built on small *proxy* variables, one per
table, `capacity` rows each. A step gathers the touched rows of the table and of its
optimizer slots (kept here at full table size) into the proxies, lets the optimizer
update the proxies, and scatters the rows back, inside the PS's one compiled step.

This is the optimizer's own update rule, applied lazily: rows without a gradient are left
alone (for SGD and Adagrad that is exactly the dense result; for momentum and Adam it is
"lazy" Adam, as TensorFlow's sparse updates have always been). Optimizers whose state is
not one value per parameter (Adafactor) are refused with `supports() == False`; the store
then applies them densely.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf


def _capacity(rows: int, index: int) -> int:
    # Proxies get distinct first dimensions, so each optimizer slot maps to its table
    # by shape alone.
    return max(64, 1 << (max(rows, 1) - 1).bit_length()) + index


class RowOptimizer:
    def __init__(
        self,
        make_optimizer: Callable[[], object],
        tables: list[tf.Variable],
        expected_rows: int = 64,
    ):
        """`expected_rows`: rows a step is expected to touch per table (the proxies' first
        size; they grow when a step touches more)."""
        self._make_optimizer = make_optimizer
        self.tables = tables
        self.slots: list[list[tf.Variable]] = []  # per table, per slot kind: full size
        self.scalars: list[np.ndarray] = []  # iteration, learning rate, ... carried over
        self.generation = 0  # bumped by every (re)build of the proxies
        self._build([expected_rows] * len(tables))

    @staticmethod
    def supports(make_optimizer: Callable[[], object]) -> bool:
        probe = make_optimizer()
        a, b = tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([4, 2]))
        probe.build([a, b])
        return all(tuple(v.shape) in ((), (3, 2), (4, 2)) for v in probe.variables)

    def _build(self, wanted: list[int]) -> None:
        """(Re)build proxies of at least `wanted` rows per table, keeping all state."""
        self.capacities = [_capacity(n, i) for i, n in enumerate(wanted)]
        self.proxies = [
            tf.Variable(tf.zeros([c, t.shape[1]], t.dtype), trainable=False)
            for c, t in zip(self.capacities, self.tables)
        ]
        optimizer = self._make_optimizer()
        optimizer.build(self.proxies)
        by_rows = {c: i for i, c in enumerate(self.capacities)}
        proxy_slots: list[list[tf.Variable]] = [[] for _ in self.tables]
        scalars = []
        for var in optimizer.variables:
            if len(var.shape) == 0:
                scalars.append(var)
            else:
                proxy_slots[by_rows[int(var.shape[0])]].append(var)
        for var, value in zip(scalars, self.scalars):  # a rebuild keeps the iteration count
            var.assign(value)
        if not self.slots:  # first build: full-size slots start as the proxies' slots do
            self.slots = [
                [tf.Variable(tf.broadcast_to(s[0], table.shape), trainable=False) for s in slots]
                for slots, table in zip(proxy_slots, self.tables)
            ]
        self.optimizer, self._proxy_slots, self._scalars = optimizer, proxy_slots, scalars
        self.generation += 1  # the variables a compiled caller captured are gone

    def ensure_capacity(self, lengths: list[int]) -> None:
        """Grow the proxies if a step touches more rows than they hold."""
        if any(n > c - t for t, (n, c) in enumerate(zip(lengths, self.capacities))):
            self.scalars = [v.numpy() for v in self._scalars]
            self._build([max(n, c - t) for t, (n, c) in enumerate(zip(lengths, self.capacities))])

    def update(self, ids_per_table, grads_per_table) -> None:
        """Graph code (call it inside a tf.function, after `ensure_capacity`): gather the
        rows and their slots into the proxies, apply the optimizer, scatter them back."""
        grads = []
        for t, (ids, grad) in enumerate(zip(ids_per_table, grads_per_table)):
            pad = [[0, self.capacities[t] - tf.shape(ids)[0]], [0, 0]]
            self.proxies[t].assign(tf.pad(tf.gather(self.tables[t], ids), pad))
            for full, proxy in zip(self.slots[t], self._proxy_slots[t]):
                proxy.assign(tf.pad(tf.gather(full, ids), pad))
            grads.append(tf.pad(grad, pad))
        self.optimizer.apply_gradients(zip(grads, self.proxies))
        for t, ids in enumerate(ids_per_table):
            n = tf.shape(ids)[0]
            self.tables[t].scatter_update(tf.IndexedSlices(self.proxies[t][:n], ids))
            for full, proxy in zip(self.slots[t], self._proxy_slots[t]):
                full.scatter_update(tf.IndexedSlices(proxy[:n], ids))

    def rows_wanted(self) -> list[int]:
        """The row counts the proxies were grown for (`ensure_capacity` takes them back)."""
        return [c - t for t, c in enumerate(self.capacities)]

    # ------------------------------------------------------------------ checkpoints

    def state(self) -> list[np.ndarray]:
        return [v.numpy() for v in self._scalars] + [
            s.numpy() for slots in self.slots for s in slots
        ]

    def restore(self, values: list[np.ndarray]) -> None:
        count = len(self._scalars)
        for var, value in zip(self._scalars, values[:count], strict=True):
            var.assign(value)
        flat = [s for slots in self.slots for s in slots]
        for var, value in zip(flat, values[count:], strict=True):
            var.assign(value)
