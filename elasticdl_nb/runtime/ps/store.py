"""One PS shard's state: its dense variables, its embedding tables (the rows it owns that
training has reached, `tables/table.py`), the Keras optimizer that updates them, the model
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
from pathlib import Path

import numpy as np
import tensorflow as tf

from elasticdl_nb.keras_flavor import optimizer_variables
from elasticdl_nb.runtime.compiled_call import CompiledCall
from elasticdl_nb.runtime.ps.dense_update import DenseUpdate
from elasticdl_nb.runtime.ps.pending_version import PendingVersion
from elasticdl_nb.runtime.ps.push import BatchId, Push
from elasticdl_nb.runtime.ps.row_optimizer import RowOptimizer
from elasticdl_nb.runtime.ps.tables.table import EmbeddingTable
from elasticdl_nb.runtime.table_def import TableDef
from elasticdl_nb.runtime.table_export import write_shard


class TableError(ValueError):
    """A table cannot be served as asked (the message says why and what to do)."""


@dataclass
class VariableSpec:
    """A dense variable and its value."""

    name: str
    value: np.ndarray


@dataclass
class Exchanged:
    """What one exchange did and read, all as of one moment."""

    accepted: bool  # the push counts: applied, or (synchronous) waiting for its version
    stale: bool  # (synchronous) refused: computed on an older version than `version`
    updated: bool  # a new version was applied
    version: int
    dense: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]
    learning_rate: float  # of the newest applied update (0 before the first)


class ParameterStore:
    def __init__(
        self,
        make_optimizer: Callable[[], object],
        ps_id: int,
        num_ps: int,
        record_ledger: bool = False,
        minibatch_size: int = 64,
        grads_to_wait: int = 0,
        rate_at: Callable[[int], float] | None = None,
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
        self.tables: dict[str, EmbeddingTable] = {}
        self.applied: dict[BatchId, set[int]] = defaultdict(set)
        self.ledger: dict[BatchId, list[tuple[int, int]]] = defaultdict(list)
        self.duplicates = 0  # pushes dropped because their batch was already applied
        # Synchronous training (pending_version.py): what waits for the next version.
        self.pending = PendingVersion(grads_to_wait) if grads_to_wait else None
        self.stale = 0  # pushes refused as computed on an older version
        self.learning_rate = 0.0
        # ElasticDL's LearningRateScheduler: the rate of the update from version v.
        self._rate_at = rate_at

    # ------------------------------------------------------------------ set-up

    def init(
        self,
        dense: list[VariableSpec],
        tables: list[TableDef] = (),
        seeds: dict[str, np.ndarray] | None = None,
    ) -> bool:
        """Create the variables from the first worker's values and the tables from its
        definitions, holding the `seeds` rows where given (this shard's ids of a whole
        table, in order); later calls are ignored."""
        with self.lock:
            if self.initialized:
                return False
            self._create(dense, list(tables))
            for name, rows in (seeds or {}).items():
                table = self.tables[name]
                ids = np.arange(self.ps_id, table.definition.input_dim, self.num_ps)
                numbers, states = table.states(ids)
                states[:, : table.dim] = rows
                table.write(ids, numbers, states, self.version)
            return True

    def _create(self, dense: list[VariableSpec], tables: list[TableDef]) -> None:
        if tables and not RowOptimizer.supports(self._make_optimizer):
            raise TableError(
                f"{type(self._make_optimizer()).__name__} keeps state that is not one value "
                "per parameter, so it cannot update embedding rows one by one on the PS: use "
                "SGD, Adam, Adagrad, RMSprop or another per-parameter optimizer."
            )
        for spec in sorted(dense, key=lambda s: s.name):
            self.dense[spec.name] = tf.Variable(spec.value, name=spec.name.replace("/", "_"))
        tables = sorted(tables, key=lambda t: t.name)
        self.optimizer = self._make_optimizer()
        self._dense_vars = list(self.dense.values())
        self.optimizer.build(self._dense_vars)
        # (made once: a step recompiled for larger row proxies reuses its XLA lowering)
        self._dense_update = DenseUpdate(self.optimizer, self._dense_vars)
        self.rows = (
            RowOptimizer(
                self._make_optimizer, [(t.dim, t.dtype) for t in tables], self._expected_rows
            )
            if tables
            else None
        )
        self.tables = {
            t.name: EmbeddingTable(t, fresh, self.num_ps)
            for t, fresh in zip(tables, self.rows.fresh_slots if self.rows else [])
        }
        self._step = self._compile_step()
        self._step_generation = self.rows.generation if self.rows else 0
        self.initialized = True

    def _compile_step(self):
        """One compiled call per request that applies gradients or reads dense variables:
        apply a minibatch's gradients (if any), then read the dense variables if asked.
        Compiled once per (has gradients, reads dense) combination; returns (dense values,
        the touched rows' new states, the learning rate the update was applied with)."""
        optimizer, dense_vars, rows = self.optimizer, self._dense_vars, self.rows
        apply_dense = self._dense_update

        def step(grads, read_dense: bool):
            states = []
            # (a schedule's rate at the step about to be applied: the PS's version)
            rate = tf.cast(optimizer.learning_rate, tf.float64)
            if grads is not None:
                dense_grads, row_states, row_grads = grads
                if dense_vars:
                    apply_dense(dense_grads)
                if rows:
                    states = rows.update(row_states, row_grads)
            dense = [tf.identity(v) for v in dense_vars] if read_dense else []
            return dense, states, rate

        definitions = [t.definition for t in self.tables.values()]
        grad_specs = (
            [tf.TensorSpec(v.shape, v.dtype) for v in dense_vars],
            [tf.TensorSpec([None, t.width], t.definition.dtype) for t in self.tables.values()],
            [tf.TensorSpec([None, d.dim], d.dtype) for d in definitions],
        )
        # Traced now, before the PS reports ready, rather than on a worker's first request
        # (a relaunched PS would otherwise stall the job a second longer).
        compiled = {
            True: CompiledCall(lambda g: step(g, True), [grad_specs], "PS step"),
            False: CompiledCall(lambda g: step(g, False), [grad_specs], "PS step"),
        }
        read = CompiledCall(lambda: step(None, True), [], "PS read")

        def call(grads, read_dense: bool):
            if grads is not None:
                return compiled[read_dense](grads)
            return read() if read_dense else ([], [], None)

        return call

    # ------------------------------------------------------------------ the request path

    def exchange(
        self, push: Push | None, known_version: int, pull_ids: dict[str, np.ndarray]
    ) -> Exchanged:
        """Take `push` (apply it; or, synchronous, add it to the next version, applied
        once it has `grads_to_wait` gradients) unless its minibatch was taken already or
        it is stale, then read the rows of `pull_ids` (global ids) and, if the version is
        then newer than `known_version`, the dense variables."""
        with self.lock:
            accepted, stale, update = self._accept(push)
            updated, values = self._apply(update, known_version)
            if accepted:
                self.applied[(push.epoch, push.source)].add(push.batch_key)
                if self.record_ledger and push.ledger_range is not None:
                    self.ledger[(push.epoch, push.source)].append(push.ledger_range)
            version = self.version
            pulled = {n: self.tables[n].read(ids) for n, ids in pull_ids.items()}
            rate = self.learning_rate
        # The step's fresh copies, viewed in place (read-only) rather than copied again by
        # `.numpy()`: 15-18 ms of a 64 MiB pull (bench/profiles.md).
        dense = {n: np.asarray(v) for n, v in zip(self.dense, values)}
        return Exchanged(accepted, stale, updated, version, dense, pulled, rate)

    def _accept(self, push: Push | None) -> tuple[bool, bool, Push | None]:
        """Whether `push` counts, whether it is stale, and what to apply now."""
        if push is None:
            return False, False, None
        if push.batch_key in self.applied[(push.epoch, push.source)]:
            self.duplicates += 1
            return False, False, None
        if self.pending is None:
            return True, False, push
        if push.gradient_version != self.version:
            self.stale += 1
            return False, True, None
        self.pending.add(push)
        return True, False, self.pending.take() if self.pending.full else None

    def _apply(self, update: Push | None, known_version: int) -> tuple[bool, list]:
        """Apply `update` (if any) as the next version, and read the dense variables if
        the version is then newer than `known_version`; returns (whether it applied one,
        the dense values read)."""
        grads, touched = self._gradient_args(update) if update is not None else (None, [])
        if grads is not None and self.rows:
            self.rows.ensure_capacity([len(ids) for ids, _ in touched])
            if self.rows.generation != self._step_generation:
                self._step = self._compile_step()
                self._step_generation = self.rows.generation
        if update is not None:  # (on the rows' optimizer this update will use)
            self._set_learning_rate(update)
        read_dense = self.version + (grads is not None) > known_version
        values, states, rate = self._step(grads, read_dense)
        if grads is None:
            return False, values
        self.version += 1
        self.learning_rate = float(rate)
        for table, (ids, rows), new in zip(self.tables.values(), touched, states):
            table.write(ids, rows, new.numpy(), self.version)
            table.enforce(self.version)
        return True, values

    def _set_learning_rate(self, update: Push) -> None:
        """The rate for this update, where it is not the optimizer's own: a version
        schedule's, or the one the master's callbacks set (carried by the push)."""
        rate = self._rate_at(self.version) if self._rate_at else update.learning_rate
        if rate:
            self.optimizer.learning_rate = rate  # (assigns its variable: no retrace)
            if self.rows:
                self.rows.optimizer.learning_rate = rate

    def flush(self) -> bool:
        """Synchronous: apply what waits for the next version now, however few gradients
        (the end of an epoch); returns whether it applied a version."""
        with self.lock:
            if self.pending is None or not self.pending.count:
                return False
            return self._apply(self.pending.take(), 1 << 62)[0]

    def _gradient_args(self, push: Push):
        """The compiled step's gradient arguments, and per table the (ids, row numbers)
        whose new states it returns."""
        dense = [
            push.dense[name]
            if name in push.dense
            else np.zeros(var.shape, var.dtype.as_numpy_dtype)
            for name, var in self.dense.items()
        ]
        states, values, touched = [], [], []
        for name, table in self.tables.items():
            ids, rows = push.tables.get(name, (np.zeros(0, np.int64), None))
            if rows is None:
                rows = np.zeros((0, table.dim), table.definition.dtype)
            ids, rows = table.admit(ids, rows)
            numbers, current = table.states(ids)
            touched.append((np.asarray(ids, np.int64), numbers))
            states.append(current)
            values.append(rows)
        return (dense, states, values), touched

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
        return self.exchange(push, 1 << 62, {}).accepted

    def read(
        self, dense: bool, ids: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The dense variables (if `dense`) and the rows of the given global ids."""
        done = self.exchange(None, -1 if dense else 1 << 62, ids)
        return done.dense, done.rows

    def read_dense(self) -> dict[str, np.ndarray]:
        return self.read(True, {})[0]

    def read_rows(self, table: str, global_ids: np.ndarray) -> np.ndarray:
        return self.read(False, {table: global_ids})[1][table]

    def read_table(self, name: str) -> np.ndarray:
        """This shard's part of a whole table (ids `ps_id`, `ps_id + num_ps`, ... below its
        `input_dim`), for an export into a Keras model."""
        with self.lock:
            table = self.tables[name]
            if not table.definition.input_dim:
                raise TableError(
                    f"table '{name}' has no input_dim: its ids may be any int64, so it "
                    "has no whole form to export into a Keras Embedding."
                )
            ids = np.arange(self.ps_id, table.definition.input_dim, self.num_ps, dtype=np.int64)
            return table.read(ids)

    def export_tables(self, directory: Path) -> dict[str, int]:
        """Write the rows this shard holds of every table as (id, vector) files (copied
        under the lock, written outside it); returns the rows written per table."""
        with self.lock:
            snapshots = [t.snapshot() for t in self.tables.values()]
        for snap in snapshots:
            vectors = snap.states[:, : snap.definition.dim]
            write_shard(directory, snap.definition, self.ps_id, self.num_ps, snap.ids, vectors)
        return {snap.definition.name: len(snap.ids) for snap in snapshots}

    def table_stats(self) -> dict[str, dict]:
        """Per table: rows held, bytes, and rows created and evicted, gradients refused."""
        with self.lock:
            return {name: table.stats() for name, table in self.tables.items()}

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self, since: int | None = None) -> dict:
        """Everything a checkpoint holds, copied under the lock: the tables whole, or,
        `since` a checkpoint's version, what changed in them since (a delta checkpoint;
        the rest is whole in either)."""
        with self.lock:
            return {
                "version": self.version,
                "parent": since,
                "variables": [VariableSpec(n, v.numpy()) for n, v in self.dense.items()],
                "tables": [t.snapshot(since) for t in self.tables.values()],
                "optimizer": [v.numpy() for v in optimizer_variables(self.optimizer)],
                "row_optimizer": self.rows.state() if self.rows else [],
                "row_rows": self.rows.rows_wanted() if self.rows else [],
                **self._durable_record(),
            }

    def _durable_record(self) -> dict:
        """The applied-minibatch record and ledger as a checkpoint holds them: without
        the minibatches still waiting for their version (synchronous training), which a
        restore from it loses and the master has redone."""
        applied = {k: set(v) for k, v in self.applied.items()}
        ledger = {k: list(v) for k, v in self.ledger.items()}
        for batch, key, ledger_range in self.pending.batches if self.pending else []:
            applied[batch].discard(key)
            if ledger_range is not None and ledger_range in ledger.get(batch, []):
                ledger[batch].remove(ledger_range)
        return {
            "applied": {k: sorted(v) for k, v in applied.items()},
            "ledger": ledger,
            "learning_rate": self.learning_rate,
        }

    def saved(self, version: int) -> None:
        """A checkpoint of `version` is on disk (a later delta starts from it)."""
        with self.lock:
            for table in self.tables.values():
                table.saved(version)

    def restore(self, state: dict) -> None:
        """Become the shard a checkpoint holds (its tables whole: `CheckpointDir` folds
        a delta checkpoint into its base)."""
        with self.lock:
            self._create(state["variables"], [t.definition for t in state["tables"]])
            for var, value in zip(
                optimizer_variables(self.optimizer), state["optimizer"], strict=True
            ):
                var.assign(value)
            for snapshot in state["tables"]:
                self.tables[snapshot.definition.name].load(snapshot)
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
            self.learning_rate = state.get("learning_rate", 0.0)
            if self.pending is not None:
                self.pending = PendingVersion(self.pending.grads_to_wait)
            self.applied = defaultdict(set, {k: set(v) for k, v in state["applied"].items()})
            self.ledger = defaultdict(
                list, {k: [tuple(r) for r in v] for k, v in state["ledger"].items()}
            )
