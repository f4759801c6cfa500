"""`JobView`: a job as every client shows it, folded from its event journal.

This is the one fold of the journal on the client: the text progress (progress.py), the
notebook dashboard (`elasticdl_nb.widgets`), the server extension's summaries and through
them the JupyterLab sidebar all read a `JobView`, so each rule (which workers are live,
when a straggler stops being one, the goodput, the workers over time) is written here
once. No widgets: `JobView.apply(event)` takes journal events one by one (docs/events.md)
and keeps the header (with the master's goodput and restarts), the progress, the
instances and the stragglers among them, a bounded event log, the loss and evaluation
curves, and the workers over time with the faults and relaunches marked (`Timeline`,
timeline.py). Everything it shows is derived from events, so replaying the journal from
seq 0 (reattaching after a kernel restart) rebuilds exactly the view that following the
job live had built. Times come from the events' own stamps; only "now" (for the elapsed
time and the ETA of a running job) is passed in by the caller.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.sdk.view.series import Series
from elasticdl_nb.sdk.view.text import INSTANCE_LOST, describe
from elasticdl_nb.sdk.view.timeline import Timeline
from elasticdl_nb.spec.errors import SpecError
from elasticdl_nb.vocabulary import (
    FINAL_STATES,
    INSTANCE_ENDED,
    Event,
    EventKind,
    GroupChange,
    InstanceState,
    JobState,
    Phase,
    Role,
)
from elasticdl_nb.vocabulary.events import (
    EvaluationData,
    GroupSettledData,
    GrowthData,
    InstanceData,
    RelaunchData,
    ScaleData,
    WorkerFloorData,
    payload,
)

# The table's word for a PS between its end and its relaunch under the same id (a
# `relaunch` event); not a journal word, so not an `InstanceState`.
RELAUNCHING = "relaunching"
# What `progress` and `job_state` events carry about the training's progress.
PROGRESS_FIELDS = (
    "epoch",
    "epochs",
    "step",
    "records_done",
    "records_per_epoch",
    "records_per_second",
    "goodput",
    "training_s",
    "recovering_s",
)
# The events that change the workers over time or put a mark on it.
TIMELINE_KINDS = frozenset(
    {
        EventKind.INSTANCE,
        EventKind.SCALE,
        EventKind.RELAUNCH,
        EventKind.MASTER_RESTARTED,
        EventKind.STRAGGLER,
    }
)


class JobLike(Protocol):
    """What a view needs of a job; `elasticdl_nb.Job` has it all (and `dir`, whose spec
    gives the backend, the epochs, the workers and the PS, when there is one)."""

    @property
    def name(self) -> str: ...

    def events(
        self, from_seq: int = 0, follow: bool = True, timeout: float | None = None
    ) -> Iterator[Event]: ...

    def scale(self, workers: int | str) -> dict: ...

    def stop(self) -> dict: ...


@dataclass
class InstanceRow:
    """One worker or PS as the journal last described it."""

    role: str
    id: int
    state: str = InstanceState.STARTED  # an InstanceState, or RELAUNCHING
    restarts: int = 0  # relaunches before this one (a relaunched worker gets a new id)
    replaces: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class LogLine:
    seq: int
    time: float
    text: str
    error: bool = False


class JobView:
    """One job as the journal tells it; feed it with `apply` in journal order (or
    `catch_up(job)`)."""

    def __init__(
        self,
        name: str,
        backend: str = "?",
        epochs: int | None = None,
        workers: int | None = None,
        ps: int | None = None,
        min_workers: int = 0,
        log_lines: int = 200,
        loss_capacity: int = 1024,
        tensorboard_dir: str = "",
    ):
        self.name = name
        self.tensorboard_dir = tensorboard_dir  # where its TensorBoard log is ("" = none)
        self.backend = backend
        self.epochs = epochs
        self.workers = workers  # desired workers: the spec's, then each `scale` event's
        self.min_workers = min_workers  # a range's MIN (0: a fixed number), the same way
        # The newest `worker_floor` event's data: a range job below its MIN (`below`).
        self.floor: dict[str, Any] = {}
        # The newest `growth` event's data (scale_policy="throughput"): what it asks for.
        self.growth: dict[str, Any] = {}
        self.ps = ps
        self.state: str = JobState.STARTING
        self.reason = ""
        self.phase: str = Phase.TRAINING
        self.last_seq = -1
        self.started_at: float | None = None  # time of the first event
        self.ended_at: float | None = None  # time of the terminal job_state
        self.progress: dict[str, Any] = {}
        self.progress_at: float | None = None  # time of the event that last set `progress`
        self.tasks_total = 0  # training tasks of the current epoch (its `epoch` event)
        self.tasks_done = 0  # `progress` events since: one per finished training task
        self.evaluating: int | None = None  # the evaluation round under way, if any
        self.predicted = 0  # records of the prediction data with their predictions
        self.predictions_path = ""  # where they are, once every record has one
        self.instances: dict[tuple[str, int], InstanceRow] = {}
        self.log: deque[LogLine] = deque(maxlen=log_lines)
        self.loss = Series(loss_capacity)
        self.last_loss: float | None = None
        self.metrics: dict[str, Series] = {}
        self.last_metrics: dict[str, Any] = {}  # the newest evaluation's, name -> value
        self._metric_capacity = max(2, loss_capacity // 2)
        # Allreduce jobs: the group's newest version and members, and how long the last
        # change took until the group stepped again (journal "group", "group_settled").
        self.group_version = 0
        self.group_members: list[int] = []
        self.last_change: tuple[str, float] | None = None  # (cause, seconds)
        self.stragglers: dict[int, dict] = {}  # worker -> its `straggler` event's data
        self._live: set[int] = set()  # workers started or running
        self._standby: set[int] = set()  # standby workers started or running (no work yet)
        self._pending: dict[int, str] = {}  # workers waiting to be scheduled -> why
        self.master_restarts = 0
        self.master_saturated: dict | None = None  # its `master_saturated` data, while behind
        self.timeline = Timeline()
        # Bumped when the table or the log change: a renderer redraws those only then.
        self.instances_version = 0
        self.log_version = 0

    @classmethod
    def for_job(cls, job: JobLike, **options: Any) -> JobView:
        """A view of `job`, with the backend, epochs, workers and PS of its spec, and
        where its TensorBoard log is (when it writes one)."""
        try:
            files = JobDir(Path(job.dir))  # (AttributeError, TypeError: a job without files)
            spec = files.read_spec()
        except (AttributeError, TypeError, OSError, SpecError):
            return cls(name=job.name, **options)  # a view still, with '?' for these
        return cls(
            name=job.name,
            backend=spec.backend,
            epochs=spec.epochs,
            workers=spec.workers,
            min_workers=spec.min_workers,
            ps=spec.parameter_servers,
            tensorboard_dir=str(files.tensorboard) if spec.tensorboard else "",
            **options,
        )

    def catch_up(self, job: JobLike) -> JobView:
        """Fold what `job`'s journal holds after `last_seq`, without waiting for more (a
        view kept between two looks at a job: the server extension's)."""
        for event in job.events(from_seq=self.last_seq + 1, follow=False):
            self.apply(event)
        return self

    # ------------------------------------------------------------------ folding events

    def apply(self, event: Event) -> LogLine | None:
        """Fold one journal event into the view; returns the log line it made, if any.
        Events at or below `last_seq` were seen already (a stream resumed after a
        reconnect) and are ignored."""
        if event.seq <= self.last_seq:
            return None
        self.last_seq = event.seq
        if self.started_at is None:
            self.started_at = self.timeline.origin = event.time
        handler = self._HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, event)
        if event.kind in TIMELINE_KINDS:
            self.timeline.apply(event, len(self._live), self.workers, len(self._pending))
        line = describe(event)
        return self.add_log(event.seq, event.time, line, error=_is_error(event)) if line else None

    def add_log(self, seq: int, when: float, text: str, error: bool = False) -> LogLine:
        line = LogLine(seq, when, text, error)
        self.log.append(line)
        self.log_version += 1
        return line

    def _take_progress(self, event: Event) -> None:
        fields = {k: event.data[k] for k in PROGRESS_FIELDS if k in event.data}
        if fields:
            self.progress.update(fields)
            self.progress_at = event.time
            if fields.get("epochs"):
                self.epochs = fields["epochs"]

    def _on_job_state(self, event: Event) -> None:
        d = event.data
        self.state = d["state"]
        self.reason = d.get("reason") or ""
        self._take_progress(event)
        if self.state in FINAL_STATES:
            self.ended_at = event.time
            self.evaluating = None

    def _on_progress(self, event: Event) -> None:
        self._take_progress(event)
        self.tasks_done += 1

    def _on_epoch(self, event: Event) -> None:
        self.progress["epoch"] = event.data["epoch"]
        self.progress["records_done"] = 0
        self.tasks_total = event.data.get("tasks", 0)
        self.tasks_done = 0

    def _on_phase(self, event: Event) -> None:
        self.phase = event.data["phase"]
        if self.phase == Phase.PREDICTING:  # (again after finishing went back to training)
            self.predicted = 0

    def _on_loss(self, event: Event) -> None:
        points = event.data.get("points") or []
        self.loss.extend(points)
        if points:
            self.last_loss = float(points[-1][1])

    def _on_evaluation_started(self, event: Event) -> None:
        self.evaluating = event.data.get("round")

    def _on_evaluation(self, event: Event) -> None:
        d = payload(event, EvaluationData)
        self.last_metrics = dict(d.get("metrics", {}))
        for name, value in d.get("metrics", {}).items():
            if isinstance(value, int | float):
                series = self.metrics.get(name)
                if series is None:
                    series = self.metrics[name] = Series(self._metric_capacity, mode="mean")
                series.add(d["step"], value)
        if self.evaluating == d.get("round"):
            self.evaluating = None

    def _on_prediction_task(self, event: Event) -> None:
        self.predicted += int(event.data["records"])

    def _on_predictions(self, event: Event) -> None:
        self.predicted = int(event.data["records"])
        self.predictions_path = event.data["path"]

    def _on_scale(self, event: Event) -> None:
        d = payload(event, ScaleData)
        self.workers = d["workers_to"]
        self.min_workers = d.get("min_workers", 0)
        if not self.min_workers:  # a fixed count: the growth policy lets go (growth.py)
            self.growth = {}

    def _on_worker_floor(self, event: Event) -> None:
        self.floor = dict(payload(event, WorkerFloorData))

    def _on_growth(self, event: Event) -> None:
        self.growth = dict(payload(event, GrowthData))

    def _on_group(self, event: Event) -> None:
        self.group_version = event.data["version"]
        self.group_members = list(event.data["members"])

    def _on_group_settled(self, event: Event) -> None:
        d = payload(event, GroupSettledData)
        if d["cause"] != GroupChange.FORMED:
            self.last_change = (d["cause"], float(d["seconds"]))

    def _row(self, role: str, instance_id: int) -> InstanceRow:
        key = (role, int(instance_id))
        row = self.instances.get(key)
        if row is None:
            row = self.instances[key] = InstanceRow(role, int(instance_id))
        return row

    def _on_instance(self, event: Event) -> None:
        d = payload(event, InstanceData)
        row = self._row(d["role"], d["id"])
        row.state = d["kind"]
        if d.get("pid"):
            row.pid = d["pid"]
        live = d["kind"] in (InstanceState.STARTED, InstanceState.RUNNING)
        if d["role"] == Role.WORKER:
            standing_by = live and d.get("standby", False)
            (self._standby.add if standing_by else self._standby.discard)(row.id)
            (self._live.add if live and not standing_by else self._live.discard)(row.id)
            if d["kind"] == InstanceState.PENDING:
                self._pending[row.id] = d.get("reason", "")
            else:
                self._pending.pop(row.id, None)
        if d["kind"] == InstanceState.PENDING:
            row.reason = d.get("reason", "")
        if live:
            row.exit_code, row.signal = None, None
            if d["kind"] == InstanceState.STARTED:
                row.reason = ""
        if d["kind"] in INSTANCE_ENDED:
            if d["role"] == Role.WORKER:  # an ended worker is no straggler any more
                self.stragglers.pop(row.id, None)
            row.exit_code = d.get("exit_code")
            row.signal = d.get("signal")
            row.reason = d.get("reason") or d["kind"]
        self.instances_version += 1

    def _on_straggler(self, event: Event) -> None:
        self.stragglers[event.data["worker"]] = event.data
        self.instances_version += 1

    def _on_straggler_cleared(self, event: Event) -> None:
        self.stragglers.pop(event.data["worker"], None)
        self.instances_version += 1

    def _on_master_restarted(self, event: Event) -> None:
        self.master_restarts = event.data["incarnation"]
        self.master_saturated = None  # (a new master: its own load, its own events)

    def _on_master_saturated(self, event: Event) -> None:
        self.master_saturated = event.data

    def _on_master_caught_up(self, event: Event) -> None:
        self.master_saturated = None

    def _on_relaunch(self, event: Event) -> None:
        d = payload(event, RelaunchData)
        old = self._row(d["role"], d["replaces"])
        if d["id"] == d["replaces"]:  # a PS comes back under its own id
            old.restarts += 1
            old.state = RELAUNCHING
        else:  # a worker is replaced by a new one (or by a standby, ready already)
            new = self._row(d["role"], d["id"])
            new.restarts = old.restarts + 1
            new.replaces = old.id
            if d.get("promoted") and new.id in self._standby:
                self._standby.discard(new.id)
                self._live.add(new.id)
        self.instances_version += 1

    _HANDLERS: ClassVar[dict[str, Callable[[JobView, Event], None]]] = {
        EventKind.JOB_STATE: _on_job_state,
        EventKind.PROGRESS: _on_progress,
        EventKind.EPOCH: _on_epoch,
        EventKind.PHASE: _on_phase,
        EventKind.LOSS: _on_loss,
        EventKind.EVALUATION_STARTED: _on_evaluation_started,
        EventKind.EVALUATION: _on_evaluation,
        EventKind.PREDICTION_TASK: _on_prediction_task,
        EventKind.PREDICTIONS: _on_predictions,
        EventKind.SCALE: _on_scale,
        EventKind.WORKER_FLOOR: _on_worker_floor,
        EventKind.GROWTH: _on_growth,
        EventKind.GROUP: _on_group,
        EventKind.GROUP_SETTLED: _on_group_settled,
        EventKind.INSTANCE: _on_instance,
        EventKind.RELAUNCH: _on_relaunch,
        EventKind.STRAGGLER: _on_straggler,
        EventKind.STRAGGLER_CLEARED: _on_straggler_cleared,
        EventKind.MASTER_RESTARTED: _on_master_restarted,
        EventKind.MASTER_SATURATED: _on_master_saturated,
        EventKind.MASTER_CAUGHT_UP: _on_master_caught_up,
    }

    # ------------------------------------------------------------------ derived figures

    @property
    def ended(self) -> bool:
        """The job has reached a state after which nothing changes any more."""
        return self.state in FINAL_STATES

    def elapsed(self, now: float | None = None) -> float:
        """Seconds from the first event to the job's end, or to `now` while it runs."""
        if self.started_at is None:
            return 0.0
        end = self.ended_at if self.ended_at is not None else _now(now)
        return max(0.0, end - self.started_at)

    def records_total(self) -> int:
        return int(self.progress.get("records_per_epoch") or 0)

    def records_done(self) -> int:
        return int(self.progress.get("records_done") or 0)

    def records_per_second(self) -> float:
        return float(self.progress.get("records_per_second") or 0.0)

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left: the records still to train in this and the remaining epochs at
        the master's current rate, counted down since that rate was reported. None while
        the rate or the size is unknown, and once the job has ended."""
        per_epoch, rate = self.records_total(), self.records_per_second()
        if self.ended or not per_epoch or rate <= 0 or self.progress_at is None:
            return None
        epochs = self.epochs or self.progress.get("epochs") or 1
        epoch = int(self.progress.get("epoch") or 0)
        left = max(0, per_epoch - self.records_done()) + max(0, epochs - epoch - 1) * per_epoch
        return max(0.0, left / rate - max(0.0, _now(now) - self.progress_at))

    def goodput(self) -> float | None:
        """The master's goodput as of its newest `progress` or `job_state` event."""
        return self.progress.get("goodput")

    def live_workers(self) -> int:
        """Workers started or running, as their newest `instance` events said."""
        return len(self._live)

    def pending_workers(self) -> dict[int, str]:
        """Workers waiting to be scheduled or started, and why (the scheduler's own
        words: "unschedulable: 0/1 nodes are available: 1 Insufficient cpu.")."""
        return dict(self._pending)

    def workers_text(self) -> str:
        """What the job asks for: '3', or the range '2:6' ('?' when not known)."""
        if self.workers is None:
            return "?"
        return f"{self.min_workers}:{self.workers}" if self.min_workers else str(self.workers)

    def waiting_for_workers(self) -> str:
        """Why training waits for workers ('' when it does not): a range job below MIN."""
        d = self.floor
        if self.ended or not d.get("below"):
            return ""
        what = "training waits" if d.get("held") else "the group goes on"
        return f"{d['running']} of at least {d['min']} workers running: {what}"

    def growth_text(self) -> str:
        """What the throughput policy does now ('holding at 3: the 4th added 2%'), ''
        without the policy or once the job has ended."""
        return "" if self.ended else self.growth.get("reason", "")

    def parameter_servers(self) -> int:
        """The job's PS: as its spec says, else (a job whose files are not visible here)
        as many as the journal has named."""
        if self.ps is not None:
            return self.ps
        return len({i for (role, i) in self.instances if role == Role.PS})

    def fraction_done(self) -> float:
        """How much of the training is done, 0..1 (1 once the job succeeded)."""
        if self.state == JobState.SUCCEEDED:
            return 1.0
        per_epoch, epochs = self.records_total(), self.epochs or self.progress.get("epochs")
        if not per_epoch or not epochs:
            return 0.0
        done = int(self.progress.get("epoch") or 0) * per_epoch + self.records_done()
        return min(1.0, done / (per_epoch * epochs))

    def summary(self) -> dict[str, Any]:
        """The job in a few figures, as the sidebar shows it: progress (with `fraction`
        done), live and desired workers, PS, the newest evaluation, goodput, master
        restarts, whether the master is behind its workers, and stragglers."""
        return {
            "name": self.name,
            "backend": self.backend,
            "state": self.state,
            "phase": self.phase,
            "progress": {
                "epoch": int(self.progress.get("epoch") or 0),
                "epochs": int(self.epochs or self.progress.get("epochs") or 0),
                "step": int(self.progress.get("step") or 0),
                "fraction": self.fraction_done(),
                "records_per_second": self.records_per_second(),
            },
            "workers": self.workers_summary(),
            "ps": self.parameter_servers(),
            "metrics": dict(self.last_metrics),
            "goodput": self.goodput(),
            "master_restarts": self.master_restarts,
            "master_saturated": self.master_saturated is not None,
            "stragglers": sorted(self.stragglers),
        }

    def workers_summary(self) -> dict[str, Any]:
        """Live, pending and desired workers, a range's MIN, why the newest pending one
        waits, whether training waits for workers, what the growth policy does, and the
        standby workers (`standby`, when there are some)."""
        pending = self.pending_workers()
        return {
            "live": self.live_workers(),
            "desired": self.workers or 0,
            "min": self.min_workers,
            "pending": len(pending),
            **({"standby": len(self._standby)} if self._standby else {}),
            "pending_reason": pending[max(pending)] if pending else "",
            "waiting": self.waiting_for_workers(),
            "growth": self.growth_text(),
        }

    def rows(self) -> list[InstanceRow]:
        """Instances in table order: PS first, then workers, each by id."""
        return sorted(self.instances.values(), key=lambda r: (r.role != Role.PS, r.role, r.id))

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything shown, as plain data (for comparing two views)."""
        return {
            "header": {
                "name": self.name,
                "backend": self.backend,
                "state": self.state,
                "reason": self.reason,
                "phase": self.phase,
                "elapsed": self.elapsed(now),
                "eta": self.eta(now),
                "workers": (self.live_workers(), self.workers),
                "workers_summary": self.workers_summary(),
                "group": (self.group_version, self.group_members, self.last_change),
                "goodput": self.goodput(),
                "master_restarts": self.master_restarts,
                "stragglers": dict(self.stragglers),
            },
            "progress": dict(self.progress, tasks=(self.tasks_done, self.tasks_total)),
            "instances": [vars(r).copy() for r in self.rows()],
            "log": [(line.seq, line.text, line.error) for line in self.log],
            "loss": self.loss.xy(),
            "metrics": {name: s.xy() for name, s in sorted(self.metrics.items())},
            "timeline": {
                "live": self.timeline.live.xy(),
                "desired": self.timeline.desired.xy(),
                "pending": self.timeline.pending.xy(),
                "marks": list(self.timeline.marks),
            },
        }


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _is_error(event: Event) -> bool:
    d = event.data
    if event.kind == EventKind.JOB_STATE:
        return d.get("state") == JobState.FAILED
    if event.kind == EventKind.INSTANCE:
        return d.get("kind") in INSTANCE_LOST
    if event.kind == EventKind.GROUP:
        return d.get("reason") == GroupChange.FAILURE
    return event.kind in (
        EventKind.MASTER_RESTARTED,
        EventKind.RELAUNCH_REFUSED,
        EventKind.PS_RESTORED,
        EventKind.PENDING_TOO_LONG,
    )
