"""Stragglers: a worker whose step time stays above twice the median of the others.

What it reads: the `worker_time` event a worker's report of each finished training task
makes (`task_s`, `compute_s`, `minibatches`). A worker's *step time* is the median, over
its last `SAMPLES` training tasks, of the seconds per minibatch, where the seconds are

- with parameter servers, `task_s`: the task's wall time; a worker waits for nobody but
  the PS, so a slow one is slow on its own;
- with allreduce, `compute_s`: the time in its own gradient computation. Every member
  waits for the slowest at each step, so the members' wall times are all the same; their
  own compute time is what singles the slow one out (the others spend the difference
  waiting in the reduction, `wait_s`).

Each worker's first training task (tracing the step, warming up) is left out.

A worker *lags* when its step time is above `RATIO` × the median of the step times of
the other live workers (those that finished a task in the last `STALE_S` seconds). It
is flagged a straggler, with a `straggler` event, once it has lagged at every judgement
for `SUSTAIN_S` seconds; it stops being one, with a `straggler_cleared` event, once it
has not lagged for `SUSTAIN_S` seconds, or when it ends or retires. Judgements are made
at a `worker_time` event, at that event's time, at most every `JUDGE_EVERY_S` (a
judgement weighs every worker against the others: with a thousand workers finishing tasks,
one per event was most of the master's time), so a worker that starts lagging at t is
flagged within t + `SUSTAIN_S` + `JUDGE_EVERY_S` + the time its next `SAMPLES` // 2 + 1
slow tasks take.

`Stragglers` is a fold over the journal (`goodput.JournalFold`): the master that wrote
the events and one that replaced it judge the same; a new master journals a flag or a
clearing the old one had not written yet at its next `check`.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

from elasticdl_nb.runtime.master.goodput import JournalFold
from elasticdl_nb.runtime.master.journal import Event, Journal
from elasticdl_nb.vocabulary import INSTANCE_ENDED, EventKind, InstanceState, Role, Strategy

RATIO = 2.0
SAMPLES = 3  # a worker's step time: the median of its last SAMPLES training tasks
SUSTAIN_S = 8.0  # lagging (or not) this long flags (or clears) a straggler
STALE_S = 60.0  # a worker without a training task in this long is left out of the median
JUDGE_EVERY_S = 1.0  # judgements at most this often, by the events' clock


@dataclass
class _Worker:
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    tasks: int = 0  # training tasks seen (the first is not a sample)
    last: float = 0.0  # when its newest task was reported
    lagging_since: float | None = None
    fine_since: float | None = None
    judged: dict = field(default_factory=dict)  # the newest judgement's figures

    def step_s(self) -> float | None:
        return statistics.median(self.samples) if len(self.samples) == SAMPLES else None


class Stragglers(JournalFold):
    """The job's stragglers (module docstring), folded from its journal; `check` journals
    what changed. Guarded by the master's lock."""

    def __init__(self, journal: Journal, strategy: str):
        super().__init__(journal)
        self._seconds = "compute_s" if strategy == Strategy.ALLREDUCE else "task_s"
        self._workers: dict[int, _Worker] = {}  # live workers
        self.flagged: dict[int, dict] = {}  # worker -> its `straggler` event's data
        self._now = 0.0  # the time of the newest judgement

    # ------------------------------------------------------------------ folding

    def apply(self, event: Event) -> None:
        d = event.data
        if event.kind == EventKind.WORKER_TIME:
            self._sample(event.time, d)
        elif event.kind == EventKind.INSTANCE and d["role"] == Role.WORKER:
            if d["kind"] in INSTANCE_ENDED or d["kind"] == InstanceState.RETIRING:
                self._workers.pop(d["id"], None)
            elif d["kind"] in (InstanceState.STARTED, InstanceState.RUNNING):
                self._workers.setdefault(d["id"], _Worker())
        elif event.kind == EventKind.STRAGGLER:
            self.flagged[d["worker"]] = d
        elif event.kind == EventKind.STRAGGLER_CLEARED:
            self.flagged.pop(d["worker"], None)

    def _sample(self, t: float, d: dict) -> None:
        worker = self._workers.get(d["worker"])
        if worker is None or not d.get("minibatches"):
            return
        worker.tasks += 1
        worker.last = t
        if worker.tasks > 1:
            worker.samples.append(float(d[self._seconds]) / d["minibatches"])
        if t - self._now >= JUDGE_EVERY_S:
            self._judge(t)

    def _judge(self, now: float) -> None:
        """Whether each worker lags now, and since when it has (or has not)."""
        self._now = now
        steps = {
            w: s
            for w, state in self._workers.items()
            if (s := state.step_s()) is not None and now - state.last <= STALE_S
        }
        ranked = sorted(steps.values())
        for w, state in self._workers.items():
            if w not in steps or len(ranked) < 2:
                continue
            median = _median_without(ranked, steps[w])
            lags = steps[w] > RATIO * median
            state.judged = {
                "worker": w,
                "step_s": round(steps[w], 4),
                "median_s": round(median, 4),
                "ratio": round(steps[w] / median, 2) if median > 0 else None,
            }
            if lags:
                state.fine_since = None
                state.lagging_since = state.lagging_since or now
            else:
                state.lagging_since = None
                state.fine_since = state.fine_since or now

    # ------------------------------------------------------------------ deciding

    def check(self) -> None:
        """Journal a `straggler` event for each worker that has lagged for `SUSTAIN_S`,
        and a `straggler_cleared` one for each straggler that has not, or has gone."""
        self.catch_up()
        for w, state in self._workers.items():
            since = state.lagging_since
            if w not in self.flagged and since is not None and self._now - since >= SUSTAIN_S:
                self._journal.append(
                    EventKind.STRAGGLER, **state.judged, lagging_s=round(self._now - since, 1)
                )
        for w in list(self.flagged):
            state = self._workers.get(w)
            if state is None:
                self._journal.append(EventKind.STRAGGLER_CLEARED, worker=w, reason="ended")
            elif state.fine_since is not None and self._now - state.fine_since >= SUSTAIN_S:
                self._journal.append(
                    EventKind.STRAGGLER_CLEARED, **state.judged, reason="caught up"
                )
        self.catch_up()

    def status(self) -> list[dict]:
        """The stragglers now, as their `straggler` events said."""
        self.catch_up()
        return [self.flagged[w] for w in sorted(self.flagged)]


def _median_without(ranked: list[float], value: float) -> float:
    """The median of sorted `ranked` with one `value` taken out, without copying it: a
    judgement takes one per worker (O(workers log workers) in all, not workers squared)."""
    gone = bisect_left(ranked, value)
    n = len(ranked) - 1

    def at(k: int) -> float:  # the k-th of the rest
        return ranked[k if k < gone else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
