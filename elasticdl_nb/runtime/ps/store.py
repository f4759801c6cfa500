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

from elasticdl_nb.runtime.compiled_call import CompiledCall
from elasticdl_nb.runtime.ps.row_optimizer import RowOptimizer

BatchId = tuple[int, int]  # (epoch, source)


@dataclass
class VariableSpec:
    name: str
    value: np.ndarray
    is_table: bool = False
    table_rows: int = 0  # rows of the whole table (tables only)


@dataclass
class Push:
    """One minibatch's gradients, named by (epoch, source, batch_key = start offset)."""

    epoch: int
    source: int
    batch_key: int
    dense: dict[str, np.ndarray]
    tables: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (global ids, rows)
    ledger_range: tuple[int, int] | None = None


class ParameterStore:
    def __init__(
        self,
        make_optimizer: Callable[[], object],
        ps_id: int,
        num_ps: int,
        record_ledger: bool = False,
        minibatch_size: int = 64,
    ):
        self._make_optimizer = make_optimizer
        # A minibatch usually looks up one row per example per table: the row proxies start
        # that large, so the first push does not rebuild (and retrace) them.
        self._expected_rows = minibatch_size
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
            RowOptimizer(self._make_optimizer, self._table_vars, self._expected_rows)
            if self._table_vars and RowOptimizer.supports(self._make_optimizer)
            else None
        )
        dense_path = self._dense_vars + ([] if self.rows else self._table_vars)
        self.optimizer.build(dense_path)
        self._step = self._compile_step()
        self._step_generation = self.rows.generation if self.rows else 0
        self.initialized = True

    def _compile_step(self):
        """One compiled call per request: apply a minibatch's gradients (if any), then read
        what the worker asked for. Variable reads follow the updates in program order.
        Compiled once per (has gradients, reads dense) combination."""
        optimizer, dense_vars, table_vars, rows = (
            self.optimizer,
            self._dense_vars,
            self._table_vars,
            self.rows,
        )

        def step(grads, read_dense: bool, pull_ids):
            if grads is not None:
                dense_grads, ids, values = grads
                pairs = list(zip(dense_grads, dense_vars))
                if rows:
                    rows.update(ids, values)
                else:
                    pairs += [
                        (tf.IndexedSlices(v, i, tf.shape(t, tf.int64)), t)
                        for i, v, t in zip(ids, values, table_vars)
                    ]
                if pairs:
                    optimizer.apply_gradients(pairs)
            dense = [tf.identity(v) for v in dense_vars] if read_dense else []
            return dense, [tf.gather(t, i) for t, i in zip(table_vars, pull_ids)]

        id_specs = [tf.TensorSpec([None], tf.int64) for _ in table_vars]
        grad_specs = (
            [tf.TensorSpec(v.shape, v.dtype) for v in dense_vars],
            id_specs,
            [tf.TensorSpec([None, *t.shape[1:]], t.dtype) for t in table_vars],
        )

        def compile_for(has_grads: bool, read_dense: bool) -> CompiledCall:
            if has_grads:
                return CompiledCall(
                    lambda g, ids: step(g, read_dense, ids), [grad_specs, id_specs], "PS step"
                )
            return CompiledCall(lambda ids: step(None, read_dense, ids), [id_specs], "PS pull")

        # Traced now, before the PS reports ready, rather than on a worker's first request
        # (a relaunched PS would otherwise stall the job a second longer).
        compiled = {(g, r): compile_for(g, r) for g in (True, False) for r in (True, False)}

        def call(grads, read_dense: bool, pull_ids):
            if grads is None:
                return compiled[(False, read_dense)](pull_ids)
            return compiled[(True, read_dense)](grads, pull_ids)

        return call

    # ------------------------------------------------------------------ the request path

    def exchange(
        self, push: Push | None, known_version: int, pull_ids: dict[str, np.ndarray]
    ) -> tuple[bool, int, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Apply `push` unless its minibatch was applied already, then read the rows of
        `pull_ids` (global ids) and, if the version is then newer than `known_version`,
        the dense variables. Returns (applied, version, dense, rows), all as of one moment."""
        names = list(self.tables)
        local = [
            pull_ids[n] // self.num_ps if n in pull_ids else np.zeros([0], np.int64) for n in names
        ]
        with self.lock:
            grads = None
            if push is not None:
                if push.batch_key in self.applied[(push.epoch, push.source)]:
                    self.duplicates += 1
                else:
                    grads = self._gradient_args(push)
            if grads is not None and self.rows:
                self.rows.ensure_capacity([len(i) for i in grads[1]])
                if self.rows.generation != self._step_generation:
                    self._step = self._compile_step()
                    self._step_generation = self.rows.generation
            read_dense = self.version + (grads is not None) > known_version
            values, rows = self._step(grads, read_dense, local)
            if grads is not None:
                self.applied[(push.epoch, push.source)].add(push.batch_key)
                if self.record_ledger and push.ledger_range is not None:
                    self.ledger[(push.epoch, push.source)].append(push.ledger_range)
                self.version += 1
            version = self.version
        dense = {n: v.numpy() for n, v in zip(self.dense, values)}
        return (
            grads is not None,
            version,
            dense,
            {n: r.numpy() for n, r in zip(names, rows) if n in pull_ids},
        )

    def _gradient_args(self, push: Push):
        dense = [
            push.dense[name]
            if name in push.dense
            else np.zeros(var.shape, var.dtype.as_numpy_dtype)
            for name, var in self.dense.items()
        ]
        ids, values = [], []
        for name, var in self.tables.items():
            if name in push.tables:
                global_ids, rows = push.tables[name]
                ids.append(global_ids // self.num_ps)
                values.append(rows)
            else:
                ids.append(np.zeros((0,), np.int64))
                values.append(np.zeros((0, var.shape[1]), var.dtype.as_numpy_dtype))
        return dense, ids, values

    def push(
        self,
        epoch: int,
        source: int,
        batch_key: int,
        dense_grads: dict[str, np.ndarray],
        table_grads: dict[str, tuple[np.ndarray, np.ndarray]],
        ledger_range: tuple[int, int] | None,
    ) -> bool:
        """Apply one minibatch's gradients unless already applied; returns whether applied."""
        push = Push(epoch, source, batch_key, dense_grads, table_grads, ledger_range)
        return self.exchange(push, 1 << 62, {})[0]

    def read(
        self, dense: bool, ids: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The dense variables (if `dense`) and the rows of the given global ids."""
        return self.exchange(None, -1 if dense else 1 << 62, ids)[2:]

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
                "row_rows": self.rows.rows_wanted() if self.rows else [],
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
                # Proxies as large as before the restart, so the first push after it does
                # not rebuild (and retrace) them on the request path.
                if state.get("row_rows"):
                    self.rows.ensure_capacity(state["row_rows"])
                if self.rows.generation != self._step_generation:
                    self._step = self._compile_step()
                    self._step_generation = self.rows.generation
            self.version = state["version"]
            self.applied = defaultdict(set, {k: set(v) for k, v in state["applied"].items()})
            self.ledger = defaultdict(
                list, {k: [tuple(r) for r in v] for k, v in state["ledger"].items()}
            )
