"""`Timeline`: the workers over time, with the faults and relaunches on the way (the
dashboard's second chart), kept by the `JobView` as it folds the journal.

Times are seconds since the job's first event. The live, desired and pending worker counts
(pending: waiting for the scheduler to place them) are kept as their changes (a step line),
in bounded `Series`; the marks (a worker, a PS or the master lost, a relaunch, a straggler
flagged) in a bounded deque of the newest. Which workers are live is the view's to say (one
rule for every reader); the timeline only records how that number moved.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from elasticdl_nb.sdk.view.series import Series
from elasticdl_nb.sdk.view.text import INSTANCE_LOST, times_median
from elasticdl_nb.vocabulary import Event, EventKind, Role

# The kinds of mark, in the legend's order.
WORKER_LOST = "worker lost"
PS_LOST = "PS lost"
MASTER_LOST = "master restarted"
RELAUNCH = "relaunch"
STRAGGLER = "straggler"
MARK_KINDS = (WORKER_LOST, PS_LOST, MASTER_LOST, RELAUNCH, STRAGGLER)

# A trace of the chart: x, y and, for marks, their hover texts.
Trace = dict[str, list]


@dataclass(frozen=True)
class Mark:
    at: float  # seconds since the job's first event
    kind: str  # one of MARK_KINDS
    text: str  # what happened, for the hover label
    workers: int  # live workers then: where the mark sits on the chart


class Timeline:
    """Live, desired and pending workers over time, and the marks on the way.
    `apply(event, live, desired, pending)` with the counts after the event."""

    def __init__(self, capacity: int = 512, marks: int = 200):
        self.origin: float | None = None  # the time of the job's first event
        self.live = Series(capacity)  # (min-max buckets: a dip stays visible)
        self.desired = Series(capacity)
        self.pending = Series(capacity)
        self.marks: deque[Mark] = deque(maxlen=marks)
        self.version = 0  # bumped on every change: a renderer redraws only then
        self._live: int | None = None
        self._desired: int | None = None
        self._pending: int | None = None

    def apply(self, event: Event, live: int, desired: int | None, pending: int = 0) -> None:
        if self.origin is None:
            self.origin = event.time
        at = round(event.time - self.origin, 3)
        if live != self._live:
            self.live.add(at, live)
            self._live = live
            self.version += 1
        if desired is not None and desired != self._desired:
            self.desired.add(at, desired)
            self._desired = desired
            self.version += 1
        if pending != self._pending and (pending or self._pending is not None):
            self.pending.add(at, pending)  # (from the first pending worker on)
            self._pending = pending
            self.version += 1
        mark = _mark(event)
        if mark is not None:
            self.marks.append(Mark(at, mark[0], mark[1], live))
            self.version += 1

    def now(self) -> tuple[int | None, int | None, int | None]:
        """The live, desired and pending workers as of the newest event."""
        return self._live, self._desired, self._pending

    def traces(self, until: float) -> list[Trace]:
        """The chart's traces: live, desired, pending, then one per kind of mark
        (`MARK_KINDS`); the lines go on to `until` (seconds since the first event), a
        running job's now."""
        lines = []
        for series, current in zip((self.live, self.desired, self.pending), self.now()):
            xs, ys = (list(values) for values in series.xy())
            if xs and current is not None and until > xs[-1]:
                xs.append(round(until, 3))
                ys.append(current)
            lines.append({"x": xs, "y": ys})
        marks = []
        for kind in MARK_KINDS:
            of_kind = [m for m in self.marks if m.kind == kind]
            marks.append(
                {
                    "x": [m.at for m in of_kind],
                    "y": [m.workers for m in of_kind],
                    "text": [m.text for m in of_kind],
                }
            )
        return lines + marks


def _mark(event: Event) -> tuple[str, str] | None:
    """(kind, text) of the mark an event makes, or None."""
    d = event.data
    if event.kind == EventKind.INSTANCE and d.get("kind") in INSTANCE_LOST:
        if d.get("expected"):
            return None
        kind = WORKER_LOST if d["role"] == Role.WORKER else PS_LOST
        return kind, f"{d['role']} {d['id']} {d.get('reason') or d['kind']}"
    if event.kind == EventKind.MASTER_RESTARTED:
        return MASTER_LOST, f"master restarted (#{d['incarnation']}), down {d['down_s']:.1f} s"
    if event.kind == EventKind.RELAUNCH:
        return RELAUNCH, f"{d['role']} {d['id']} relaunched (replacing {d['replaces']})"
    if event.kind == EventKind.STRAGGLER:
        return STRAGGLER, f"worker {d['worker']} a straggler{times_median(d)}"
    return None
