"""One PS shard's state: its variables, the Keras optimizer that updates them, the model
version, and the record of which minibatches it has applied.

The applied-batch record is what makes redone work harmless: a minibatch is identified by
(epoch, source, start offset), and a push for a minibatch already applied is acknowledged
and dropped. It is checkpointed with the parameters, so after a restore it says exactly
which updates the restored model contains.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from elasticdl_nb.runtime.ps.row_optimizer import RowOptimizer

BatchId = tuple[int, int]  # (epoch, source)


@dataclass
class VariableSpec:
    name: str
    value: np.ndarray
    is_table: bool = False
    table_rows: int = 0  # rows of the whole table (tables only)


class ParameterStore:
    def __init__(
        self,
        make_optimizer: Callable[[], object],
        ps_id: int,
        num_ps: int,
        record_ledger: bool = False,
    ):
        self._make_optimizer = make_optimizer
        self.ps_id = ps_id
        self.num_ps = num_ps
        self.record_ledger = record_ledger
        self.lock = threading.Lock()
        self.version = 0
        self.initialized = False
        self.dense: dict[str, tf.Variable] = {}
        self.tables: dict[str, tf.Variable] = {}
        self.table_rows: dict[str, int] = {}
        self.applied: dict[BatchId, set[int]] = defaultdict(set)
        self.ledger: dict[BatchId, list[tuple[int, int]]] = defaultdict(list)
        self.duplicates = 0  # pushes dropped because their batch was already applied

    # ------------------------------------------------------------------ set-up

    def init(self, specs: list[VariableSpec]) -> bool:
        """Create the variables from the first worker's values; later calls are ignored."""
        with self.lock:
            if self.initialized:
                return False
            self._create(specs)
            return True

    def _create(self, specs: list[VariableSpec]) -> None:
        for spec in sorted(specs, key=lambda s: s.name):
            var = tf.Variable(spec.value, name=spec.name.replace("/", "_"))
            if spec.is_table:
                self.tables[spec.name] = var
                self.table_rows[spec.name] = spec.table_rows
            else:
                self.dense[spec.name] = var
        self.optimizer = self._make_optimizer()
        self._dense_vars = list(self.dense.values())
        self._table_vars = list(self.tables.values())
        # Tables get the optimizer row by row when it allows (see row_optimizer.py);
        # otherwise the main optimizer updates them whole.
        self.rows = (
            RowOptimizer(self._make_optimizer, self._table_vars)
            if self._table_vars and RowOptimizer.supports(self._make_optimizer)
            else None
        )
        dense_path = self._dense_vars + ([] if self.rows else self._table_vars)
        self.optimizer.build(dense_path)
        self._apply = self._compile_apply()
        self._read = self._compile_read()
        self.initialized = True

    def _compile_apply(self):
        optimizer, dense_vars = self.optimizer, self._dense_vars
        table_vars = [] if self.rows else self._table_vars

        @tf.function(reduce_retracing=True)
        def apply(dense_grads, table_local_ids, table_values):
            pairs = list(zip(dense_grads, dense_vars))
            for ids, values, var in zip(table_local_ids, table_values, table_vars):
                pairs.append((tf.IndexedSlices(values, ids, tf.shape(var, tf.int64)), var))
            if pairs:
                optimizer.apply_gradients(pairs)

        return apply

    def _compile_read(self):
        dense_vars, table_vars = self._dense_vars, self._table_vars

        @tf.function(reduce_retracing=True)
        def read(dense: bool, local_ids):
            values = [tf.identity(v) for v in dense_vars] if dense else []
            return values, [tf.gather(t, i) for t, i in zip(table_vars, local_ids)]

        return read

    # ------------------------------------------------------------------ updates

    def push(
        self,
        epoch: int,
        source: int,
        batch_key: int,
        dense_grads: dict[str, np.ndarray],
        table_grads: dict[str, tuple[np.ndarray, np.ndarray]],
        ledger_range: tuple[int, int] | None,
    ) -> bool:
        """Apply one minibatch's gradients unless that minibatch was applied already.
        Returns whether it was applied."""
        with self.lock:
            done = self.applied[(epoch, source)]
            if batch_key in done:
                self.duplicates += 1
                return False
            dense = [
                dense_grads[name]
                if name in dense_grads
                else np.zeros(var.shape, var.dtype.as_numpy_dtype)
                for name, var in self.dense.items()
            ]
            ids, values = [], []
            for name, var in self.tables.items():
                if name in table_grads:
                    global_ids, rows = table_grads[name]
                    ids.append(global_ids // self.num_ps)
                    values.append(rows)
                else:
                    ids.append(np.zeros((0,), np.int64))
                    values.append(np.zeros((0, var.shape[1]), var.dtype.as_numpy_dtype))
            if self.rows:
                self._apply(dense, [], [])
                self.rows.apply(ids, values)
            elif dense or ids:
                self._apply(dense, ids, values)
            done.add(batch_key)
            if self.record_ledger and ledger_range is not None:
                self.ledger[(epoch, source)].append(ledger_range)
            self.version += 1
            return True

    # ------------------------------------------------------------------ reads

    def read(
        self, dense: bool, ids: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The dense variables (if `dense`) and the rows of the given global ids, read
        together in one compiled call."""
        names = list(self.tables)
        local = [ids[n] // self.num_ps if n in ids else np.zeros([0], np.int64) for n in names]
        with self.lock:
            values, rows = self._read(dense, local)
        dense_out = {n: v.numpy() for n, v in zip(self.dense, values)} if dense else {}
        return dense_out, {n: r.numpy() for n, r in zip(names, rows) if n in ids}

    def read_dense(self) -> dict[str, np.ndarray]:
        return self.read(True, {})[0]

    def read_rows(self, table: str, global_ids: np.ndarray) -> np.ndarray:
        return self.read(False, {table: global_ids})[1][table]

    def read_tables(self) -> dict[str, np.ndarray]:
        with self.lock:
            return {name: var.numpy() for name, var in self.tables.items()}

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict:
        """Everything a checkpoint holds, copied under the lock."""
        with self.lock:
            return {
                "version": self.version,
                "variables": [
                    VariableSpec(n, v.numpy(), n in self.tables, self.table_rows.get(n, 0))
                    for n, v in {**self.dense, **self.tables}.items()
                ],
                "optimizer": [v.numpy() for v in self.optimizer.variables],
                "row_optimizer": self.rows.state() if self.rows else [],
                "applied": {k: sorted(v) for k, v in self.applied.items()},
                "ledger": {k: list(v) for k, v in self.ledger.items()},
            }

    def restore(self, state: dict) -> None:
        with self.lock:
            self._create(state["variables"])
            for var, value in zip(self.optimizer.variables, state["optimizer"], strict=True):
                var.assign(value)
            if self.rows:
                self.rows.restore(state["row_optimizer"])
            self.version = state["version"]
            self.applied = defaultdict(set, {k: set(v) for k, v in state["applied"].items()})
            self.ledger = defaultdict(
                list, {k: [tuple(r) for r in v] for k, v in state["ledger"].items()}
            )
