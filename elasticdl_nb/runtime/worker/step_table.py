"""The table an allreduce step sums besides the gradients: a row per rank, saying what
that rank put into the step and what it knows.

A row (`Row`) holds which minibatch the rank contributed (task, epoch, source, start),
its record count and loss, the newest group version it heard of, whether it heard the
job is over, whether it is about to do something slow (evaluate, export), and the newest
learning rate the master's callbacks set that it holds. Every member gets the same sums,
so every member reads the same table and decides the same after the step
(`lockstep.py`). The table is float32 like the gradients: ids are split in 16-bit halves,
which float32 holds exactly.
"""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.worker.batches import Batch


class Row:
    """The columns of one rank's row."""

    PRESENT, EPOCH, SOURCE, START_HI, START_LO, TASK_HI, TASK_LO = range(7)
    COUNT, LOSS, VERSION, FINISHED, SLOW = range(7, 12)
    # The learning rate the master's callbacks set, and which setting it is: a step
    # applies the newest any member holds, so every replica applies the same.
    RATE, RATE_SET = range(12, 14)
    WIDTH = 14


def new_table(ranks: int) -> np.ndarray:
    return np.zeros((ranks, Row.WIDTH), np.float32)


def put_minibatch(row: np.ndarray, task: pb.Task, batch: Batch, count: int, loss: float) -> None:
    """This rank's minibatch in its `row`: `count` records whose mean loss was `loss`."""
    row[Row.PRESENT], row[Row.EPOCH], row[Row.SOURCE] = 1, task.epoch, batch.source
    row[Row.START_HI], row[Row.START_LO] = _split16(batch.start)
    row[Row.TASK_HI], row[Row.TASK_LO] = _split16(task.task_id)
    row[Row.COUNT], row[Row.LOSS] = count, loss * count


def minibatches(table: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """The minibatches of a summed step: (task id, start) of each, as reported to the
    master, and (epoch, source, start) of each, as a replica's ledger keeps them."""
    present = table[table[:, Row.PRESENT] > 0]
    tasks = [
        (_join16(r[Row.TASK_HI], r[Row.TASK_LO]), _join16(r[Row.START_HI], r[Row.START_LO]))
        for r in present
    ]
    ledger = [
        (int(r[Row.EPOCH]), int(r[Row.SOURCE]), start) for r, (_, start) in zip(present, tasks)
    ]
    return tasks, ledger


def _split16(value: int) -> tuple[int, int]:
    return value >> 16, value & 0xFFFF


def _join16(hi: float, lo: float) -> int:
    return (int(hi) << 16) | int(lo)
