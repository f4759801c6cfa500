"""What a worker sends a PS for one minibatch, as the store takes it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BatchId = tuple[int, int]  # (epoch, source)


@dataclass
class Push:
    """One minibatch's gradients, named by (epoch, source, batch_key = start offset)."""

    epoch: int
    source: int
    batch_key: int
    dense: dict[str, np.ndarray]
    tables: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (distinct ids, rows)
    ledger_range: tuple[int, int] | None = None
    # Synchronous training: the PS version the gradients were computed on.
    gradient_version: int = -1
    learning_rate: float = 0.0  # set by the master's callbacks (0: the optimizer's own)
