"""Goodput: the share of the worker time a job wanted that went to training rather than to
recovering from faults. The master computes it; `progress` and `job_state` events and
`Job.status()` carry it (`goodput`, `training_s`, `recovering_s`), and the dashboard, the
text progress and the sidebar show that number.

The definition, checkable from the journal alone:

    goodput = training_s / (training_s + recovering_s)

over the job's *training clock*, from its first applied minibatch (the first `queue`
`report` with minibatches) until its end (the `job_state` it ends in) or now:

- wanted worker-seconds: the integral of the desired workers (the newest `scale` event's
  `workers_to`, or the newest `growth` event's `asked` when the throughput policy asks
  for fewer) over the clock;
- recovering worker-seconds: the integral of the worker slots that are recovering, at most
  the desired workers; `training_s` is the rest.

A worker slot is recovering from a worker's unexpected end (an `instance` event that ends
it — failed, killed, preempted, oom, deleted — with `expected` false) until the worker that
replaces it (its `relaunch` event, and that one's replacement if it too ends before it
trains) applies its first minibatch. A replacement retired before it trained ends the
slot's recovery; a refused relaunch leaves the slot recovering until a scale-down removes
it. Every slot is recovering

- while a PS is lost: from its unexpected end until it is ready again (its `instance`
  `running` event with an address) and the job has done work since (a minibatch applied,
  an evaluation task or the export): by then the work it lost is queued again;
- while the master is down: from the last event of the master that died until the
  `master_restarted` event of the one that replaced it (nothing a worker did meanwhile
  could be counted);
- while an allreduce group stalls after a failure: the `seconds` of its `group_settled`
  event (cause `failure`) before its `completed_at`.

Expected ends (a scale-down's retirement, the job's end, an exit with code 0) are not
recovery, and neither is starting up (before the first minibatch, or a worker a scale-up
added). So a run without faults has goodput 1.0 exactly.

`Goodput` is a fold over the journal (`JournalFold`): it reads the events it has not seen
at each use, the same way in the master that wrote them and in one that replaced it, so
both give the same figures.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from elasticdl_nb.runtime.master.journal import Event, Journal
from elasticdl_nb.vocabulary import (
    INSTANCE_ENDED,
    MASTER_END_STATES,
    EventKind,
    GroupChange,
    InstanceState,
    Role,
)

# An instance end that is a fault, unless it was expected (`instance` events' `expected`).
FAULTS = INSTANCE_ENDED - {InstanceState.SUCCEEDED}


class JournalFold:
    """State folded from a journal's events in order (`apply`), brought up to date by
    `catch_up`, which reads the events it has not seen yet. Guarded by its owner's lock
    (the master's)."""

    def __init__(self, journal: Journal):
        self._journal = journal
        self._next_seq = 0

    def snapshot_state(self) -> dict:
        """What it folded so far (a master's snapshot: snapshot.py)."""
        return {name: value for name, value in vars(self).items() if name != "_journal"}

    def restore_state(self, state: dict) -> None:
        vars(self).update(state)

    def catch_up(self) -> None:
        for event in self._journal.read(self._next_seq, follow=False):
            self._next_seq = event.seq + 1
            self.apply(event)

    def apply(self, event: Event) -> None:
        raise NotImplementedError


def is_fault(data: dict) -> bool:
    """Whether an `instance` event's data is an unexpected end of a worker or PS."""
    return data.get("kind") in FAULTS and not data.get("expected")


def is_work(event: Event) -> bool:
    """Whether an event shows the job working: a minibatch applied, an evaluation or
    prediction task or the export done."""
    if event.kind == EventKind.QUEUE:
        return event.data.get("op") == "report" and bool(event.data.get("starts"))
    return event.kind in (EventKind.EVALUATION_TASK, EventKind.PREDICTION_TASK, EventKind.EXPORT)


class Goodput(JournalFold):
    """The goodput of one job (the module docstring), folded from its journal."""

    def __init__(self, journal: Journal, workers: int):
        super().__init__(journal)
        self._desired: list[tuple[float, int]] = [(float("-inf"), workers)]
        self._scale_to, self._growth_cap = workers, None  # what `_desired` is made of
        self._start: float | None = None  # the first applied minibatch
        self._end: float | None = None  # the job's end
        # One worker slot's recovery: its start, keyed by the worker that is to fill the
        # slot (the one that ended, then its replacement); refused relaunches by -1, -2...
        self._slots_open: dict[int, float] = {}
        self._refused = 0  # how many, keyed -1, -2, ...
        self._lost_ps: dict[int, list] = {}  # PS id -> [lost at, ready again]
        self._slots: list[tuple[float, float]] = []  # closed recoveries of one slot
        self._every_slot: list[tuple[float, float]] = []  # of every slot
        self._recent: deque[tuple[int, float]] = deque(maxlen=256)  # (seq, time)

    # ------------------------------------------------------------------ folding

    def apply(self, event: Event) -> None:
        kind, d, t = event.kind, event.data, event.time
        self._recent.append((event.seq, t))
        if self._end is not None:
            return
        if is_work(event):
            if self._start is None and kind == EventKind.QUEUE:
                self._start = t
            self._work_done(t, d.get("worker") if kind == EventKind.QUEUE else None)
        elif kind == EventKind.SCALE:
            self._scale_to = d["workers_to"]
            if not d.get("min_workers"):  # a fixed count: no growth policy
                self._growth_cap = None
            self._scaled(t, self._wanted())
        elif kind == EventKind.GROWTH:
            self._growth_cap = d["asked"]
            self._scaled(t, self._wanted())
        elif kind == EventKind.INSTANCE:
            self._instance(t, d)
        elif kind == EventKind.RELAUNCH and d["role"] == Role.WORKER:
            since = self._slots_open.pop(d["replaces"], None)
            if since is not None:
                self._slots_open[d["id"]] = since
        elif kind == EventKind.RELAUNCH_REFUSED and d["role"] == Role.WORKER:
            since = self._slots_open.pop(d["id"], None)
            if since is not None:
                self._refused += 1
                self._slots_open[-self._refused] = since
        elif kind == EventKind.MASTER_RESTARTED:
            continued = d.get("continued", d["replayed"])  # (the journal it took over)
            self._every_slot.append((self._last_time_before(continued, t, d), t))
        elif kind == EventKind.GROUP_SETTLED and d["cause"] == GroupChange.FAILURE:
            done = float(d.get("completed_at") or t)
            self._every_slot.append((done - float(d["seconds"]), done))
        elif kind == EventKind.JOB_STATE and d["state"] in MASTER_END_STATES:
            self._end = t

    def _work_done(self, t: float, worker: int | None) -> None:
        if worker is not None and worker in self._slots_open:  # a replacement trains
            self._slots.append((self._slots_open.pop(worker), t))
        for ps_id, (lost, ready) in list(self._lost_ps.items()):
            if ready:
                self._every_slot.append((lost, t))
                del self._lost_ps[ps_id]

    def _wanted(self) -> int:
        cap = self._growth_cap
        return self._scale_to if cap is None else min(self._scale_to, cap)

    def _scaled(self, t: float, workers: int) -> None:
        fewer = self._desired[-1][1] - workers
        self._desired.append((t, workers))
        for key in [k for k in self._slots_open if k < 0][: max(0, fewer)]:
            self._slots.append((self._slots_open.pop(key), t))  # a refused slot scaled away

    def _instance(self, t: float, d: dict) -> None:
        role, instance, kind = d["role"], d["id"], d["kind"]
        if role == Role.WORKER:
            if is_fault(d):
                self._slots_open.setdefault(instance, t)  # (a replacement that ended: open)
            elif kind in INSTANCE_ENDED or kind == InstanceState.RETIRING:
                since = self._slots_open.pop(instance, None)
                if since is not None:  # a replacement retired before it trained
                    self._slots.append((since, t))
        elif role == Role.PS:
            if is_fault(d):
                self._lost_ps.setdefault(instance, [t, False])
            elif kind == InstanceState.RUNNING and "address" in d and instance in self._lost_ps:
                self._lost_ps[instance][1] = True

    def _last_time_before(self, seq: int, now: float, d: dict) -> float:
        """The time of event `seq - 1` (the dead master's last), if it is still among the
        recent ones; else `down_s` before `now`."""
        for s, t in reversed(self._recent):
            if s == seq - 1:
                return t
        return now - float(d.get("down_s", 0.0))

    # ------------------------------------------------------------------ figures

    def fields(self, now: float | None = None) -> dict[str, Any]:
        """`goodput` (None before the first minibatch), `training_s` and `recovering_s`
        (worker-seconds) up to the job's end, or `now` while it runs."""
        self.catch_up()
        if self._start is None:
            return {"goodput": None, "training_s": 0.0, "recovering_s": 0.0}
        end = self._end if self._end is not None else (time.time() if now is None else now)
        wanted = recovering = 0.0
        for a, b, desired, slots, every in self._segments(self._start, max(end, self._start)):
            wanted += desired * (b - a)
            recovering += (desired if every else min(desired, slots)) * (b - a)
        goodput = (wanted - recovering) / wanted if wanted > 0 else 1.0
        return {
            "goodput": round(goodput, 4),
            "training_s": round(wanted - recovering, 1),
            "recovering_s": round(recovering, 1),
        }

    def _segments(self, start: float, end: float) -> Iterator[tuple[float, float, int, int, bool]]:
        """(from, to, desired workers, slots recovering, every slot recovering) for the
        stretches of [start, end] where none of these change (one sweep over the ends of
        the recoveries and the scale events)."""
        slots = self._slots + [(s, end) for s in self._slots_open.values()]
        every = self._every_slot + [(lost, end) for lost, _ in self._lost_ps.values()]
        changes: list[tuple[float, int, int]] = []  # (time, slots +/-, every slot +/-)
        for a, b in slots:
            changes += [(max(a, start), 1, 0), (max(b, start), -1, 0)]
        for a, b in every:
            changes += [(max(a, start), 0, 1), (max(b, start), 0, -1)]
        changes.sort()
        scales = [(max(t, start), n) for t, n in self._desired]
        cuts = sorted({start, end, *(t for t, *_ in changes), *(t for t, _ in scales)})
        desired, open_slots, every_slot, i, j = 0, 0, 0, 0, 0
        for a, b in itertools.pairwise(c for c in cuts if start <= c <= end):
            while i < len(changes) and changes[i][0] <= a:
                open_slots, every_slot = open_slots + changes[i][1], every_slot + changes[i][2]
                i += 1
            while j < len(scales) and scales[j][0] <= a:
                desired = scales[j][1]
                j += 1
            yield a, b, desired, open_slots, every_slot > 0
