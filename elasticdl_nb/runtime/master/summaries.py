"""What the job's TensorBoard log shows, as a fold of its event journal: each event in
order gives the scalars it adds (`Summaries.scalars`). A pure function of the journal:
a master that took over from one that died folds the same events to the same scalars,
which is how its log goes on without writing a point twice or losing one
(`tensorboard_log.py`).

    tag                          step                 from
    training/loss                n (each minibatch    `loss` points
                                 reported)
    training/learning_rate       n                    `loss` points that carry a rate
    training/records_per_second  minibatches applied  `progress`
    training/goodput             minibatches applied  `progress`
    evaluation/<metric>          the round's step     `evaluation`
    job/live_workers             minibatches applied  `instance`: workers started or
                                                      running and not retiring
    job/relaunches               minibatches applied  `relaunch`: how many so far
    job/master_restarts          minibatches applied  `master_restarted`: how many so far

The x axis of the job/ scalars is the training step they happened at; TensorBoard's
"relative" or "wall" axis shows them over time instead (each scalar carries the time of
its journal event).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from elasticdl_nb.runtime.master.journal import Event
from elasticdl_nb.vocabulary import INSTANCE_ENDED, EventKind, InstanceState, Role

LOSS = "training/loss"
LEARNING_RATE = "training/learning_rate"
RECORDS_PER_SECOND = "training/records_per_second"
GOODPUT = "training/goodput"
EVALUATION = "evaluation/"  # + the metric's name
LIVE_WORKERS = "job/live_workers"
RELAUNCHES = "job/relaunches"
MASTER_RESTARTS = "job/master_restarts"


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float
    time: float  # of the journal event it comes from (Unix seconds)


def loss_points(data: dict[str, Any]) -> Iterator[tuple[int, float, float | None]]:
    """(n, loss, learning rate or None) of each point of a `loss` event: its `points`
    (`[n, loss]`) with the rates of its `learning_rates` (`[[n, rate], ...]`, when the
    job reports them; 0: not reported)."""
    rates = {int(n): rate for n, rate in data.get("learning_rates") or []}
    for n, loss in data.get("points") or []:
        rate = rates.get(int(n))
        yield int(n), float(loss), (float(rate) if rate else None)


class Summaries:
    """The scalars of a job's journal, event by event (`scalars`, in journal order)."""

    def __init__(self) -> None:
        self.step = 0  # minibatches applied, as of the newest `progress` event
        self._running: set[int] = set()  # workers started or running, not retiring
        self._relaunches = 0
        self._master_restarts = 0

    def scalars(self, event: Event) -> list[Scalar]:
        """The scalars `event` adds (none for most kinds), and the fold moved past it."""
        d, t = event.data, event.time
        if event.kind == EventKind.LOSS:
            out = []
            for n, loss, rate in loss_points(d):
                out.append(Scalar(LOSS, n, loss, t))
                if rate is not None:
                    out.append(Scalar(LEARNING_RATE, n, rate, t))
            return out
        if event.kind == EventKind.PROGRESS:
            self.step = int(d.get("step", self.step))
            out = [Scalar(RECORDS_PER_SECOND, self.step, float(d["records_per_second"]), t)]
            if d.get("goodput") is not None:
                out.append(Scalar(GOODPUT, self.step, float(d["goodput"]), t))
            return out
        if event.kind == EventKind.EVALUATION:
            return [
                Scalar(EVALUATION + name, int(d["step"]), float(value), t)
                for name, value in d["metrics"].items()
                if isinstance(value, int | float) and math.isfinite(value)
            ]
        if event.kind == EventKind.INSTANCE and d.get("role") == Role.WORKER:
            return self._worker_changed(d, t)
        if event.kind == EventKind.RELAUNCH:
            self._relaunches += 1
            return [Scalar(RELAUNCHES, self.step, self._relaunches, t)]
        if event.kind == EventKind.MASTER_RESTARTED:
            self._master_restarts += 1
            return [Scalar(MASTER_RESTARTS, self.step, self._master_restarts, t)]
        return []

    def _worker_changed(self, d: dict, t: float) -> list[Scalar]:
        """A worker's instance event: the count of live workers (as the master's
        `active_workers` counts them), when it changed."""
        before = len(self._running)
        kind = d.get("kind")
        if kind in (InstanceState.STARTED, InstanceState.RUNNING):
            self._running.add(d["id"])
        elif kind == InstanceState.RETIRING or kind in INSTANCE_ENDED:
            self._running.discard(d["id"])
        if len(self._running) == before:
            return []
        return [Scalar(LIVE_WORKERS, self.step, len(self._running), t)]
