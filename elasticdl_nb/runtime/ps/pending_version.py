"""Synchronous PS training (`grads_to_wait` = N, ElasticDL's semantics): the gradients a
PS has accepted for its next version and not yet applied.

A PS applies the average of N minibatches' gradients as one version. A gradient counts
only if it was computed on the PS's current version; the store refuses an older one as
stale, and the worker computes it again on the parameters sent back. N gradients need not
come from N different workers: a worker whose gradient was accepted goes on to its next
minibatch on the same version, so fewer live workers than N slow a version down but
never stall it.

A minibatch is recorded as applied when it is accepted (a worker that dies then does not
have it redone, and it is applied with the rest of its version). A checkpoint leaves the
accepted-but-unapplied ones out of its record, so a PS restored from it has them redone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from elasticdl_nb.runtime.ps.push import BatchId, Push


@dataclass
class PendingVersion:
    """The sums of the gradients accepted for the next version, and whose they are."""

    grads_to_wait: int
    count: int = 0
    dense: dict[str, np.ndarray] = field(default_factory=dict)
    tables: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    # (minibatch, its batch key, its ledger range): for the checkpoint's record
    batches: list[tuple[BatchId, int, tuple[int, int] | None]] = field(default_factory=list)
    learning_rate: float = 0.0

    @property
    def full(self) -> bool:
        return self.count >= self.grads_to_wait

    def add(self, push: Push) -> None:
        for name, grad in push.dense.items():
            total = self.dense.get(name)
            self.dense[name] = grad.copy() if total is None else total + grad
        for name, (ids, rows) in push.tables.items():
            self.tables.setdefault(name, []).append((ids, rows))
        self.batches.append(((push.epoch, push.source), push.batch_key, push.ledger_range))
        self.count += 1
        self.learning_rate = push.learning_rate  # (the newest a callback set)

    def take(self) -> Push:
        """The average of what was accepted, as one push (rows of an id pushed by several
        minibatches summed first); empties the version."""
        count = self.count
        dense = {name: total / count for name, total in self.dense.items()}
        tables = {}
        for name, parts in self.tables.items():
            ids = np.concatenate([i for i, _ in parts])
            rows = np.concatenate([r for _, r in parts])
            order = np.argsort(ids, kind="stable")
            distinct, starts = np.unique(ids[order], return_index=True)
            sums = np.add.reduceat(rows[order], starts, axis=0) if len(ids) else rows
            tables[name] = (distinct, (sums / count).astype(rows.dtype, copy=False))
        self.count, self.dense, self.tables, self.batches = 0, {}, {}, []
        return Push(-1, -1, -1, dense, tables, learning_rate=self.learning_rate)
