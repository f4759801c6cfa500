"""The journal's events: their kinds (`EventKind`), what each kind's data holds (one
`TypedDict` per kind, its docstring saying what the event means) and the `Event` itself.

A writer passes a kind and its fields (`journal.append(EventKind.SCALE, workers_from=2,
workers_to=3, reason="requested")`); a reader that wants the fields typed takes
`payload(event, ScaleData)`. docs/events.md's table is `event_table()` (a test fails when
the two differ), and `payload_problems` says where an event's data strays from its type:
the tests run it over every journal a real job writes.
"""

# (No `from __future__ import annotations`: TypedDict sees `Required[...]` only in
# annotations it can evaluate when the class is made.)
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NotRequired, Required, TypedDict, TypeVar, get_type_hints

# -------------------------------------------------------------------- the payloads


class ProgressData(TypedDict, total=False):
    """After each training task: where training is (`epoch` counts from 0), its rate,
    and the goodput (training over wanted worker time, None before the first
    minibatch; `training_s` and `recovering_s` in worker-seconds)."""

    epoch: int
    epochs: int
    step: int
    records_done: int
    records_per_epoch: int
    records_per_second: float
    goodput: float | None
    training_s: float
    recovering_s: float


class JobStateData(ProgressData, total=False):
    """The job's state changed (running, succeeded, failed, stopped), and why; with the
    progress fields. `recorded_by` is `supervisor` when a local job's master could not
    record its end; `keras`, when it started, the Keras every process of it runs ('3', or
    '2': tf_keras)."""

    state: Required[str]
    reason: str
    recorded_by: str
    keras: str


class LossData(TypedDict, total=False):
    """Loss points of one worker: `points` `[[n, loss], ...]` (n counts every reported
    minibatch, redone ones too); `learning_rates` `[[n, rate], ...]`, the optimizer's
    learning rate at the update that took the minibatch (PS: the newest update when its
    push was taken; allreduce: the step's)."""

    worker: Required[int]
    points: Required[list]
    learning_rates: list


class WorkerTimeData(TypedDict, total=False):
    """Where a worker's time on one training task went: `compute_s` in the train step,
    `wait_s` blocked on PS replies or in the allreduce; `stale` (with `grads_to_wait`):
    minibatches a PS refused as computed on an older version, computed again."""

    worker: Required[int]
    task: int
    minibatches: int
    task_s: float
    compute_s: float
    wait_s: float
    stale: int


class StragglerData(TypedDict, total=False):
    """A worker's step time (`step_s`, seconds per minibatch) stayed above twice the
    other workers' median (`median_s`) for `lagging_s` seconds."""

    worker: Required[int]
    step_s: float
    median_s: float
    ratio: float | None
    lagging_s: float


class StragglerClearedData(TypedDict, total=False):
    """A straggler is no longer one: it caught up (with its figures then), or ended."""

    worker: Required[int]
    reason: Required[str]
    step_s: float
    median_s: float
    ratio: float | None


class PhaseData(TypedDict):
    """The master's phase changed (training, evaluating, predicting, exporting, finishing,
    done)."""

    phase: str
    previous: str


class EpochData(TypedDict):
    """An epoch of `tasks` training tasks began."""

    epoch: int
    tasks: int


class EvaluationStartedData(TypedDict, total=False):
    """An evaluation round began; `epoch`: the epoch whose end it judges (the callbacks'
    `on_epoch_end` waits for it)."""

    round: Required[int]
    step: Required[int]
    tasks: int
    final: bool
    epoch: int | None


class EvaluationData(TypedDict, total=False):
    """An evaluation round's result: `metrics`, name -> value."""

    round: Required[int]
    step: Required[int]
    metrics: Required[dict]
    final: bool


class InstanceData(TypedDict, total=False):
    """What happened to a worker or PS (`kind`: an `InstanceState`), with what is known:
    its pid, exit code, signal and reason, and whether the master expected it (a
    retired worker); a worker above its range's MIN is `elastic` (the lowest
    priority), a `standby` one waits, ready, for a lost worker's place (the lowest
    priority too). A PS that is up again says the version it restored, its address and
    incarnation."""

    role: Required[str]
    id: Required[int]
    kind: Required[str]
    pid: int | None
    exit_code: int | None
    signal: str | None
    reason: str
    expected: bool
    restored_version: int
    address: str
    incarnation: int
    elastic: bool
    standby: bool


class PendingTooLongData(TypedDict):
    """An instance waited longer than `pending_timeout` to start (a PS: the job fails; a
    worker: it is given up)."""

    role: str
    id: int
    seconds: float
    reason: str


class MemoryRaisedData(TypedDict):
    """After an OOM kill the role's next instances get more memory (`memory`: 'OLD ->
    NEW')."""

    role: str
    id: int
    memory: str


class ScaleData(TypedDict):
    """The desired number of workers changed (`workers_to`; with a range, its MIN in
    `min_workers`)."""

    workers_from: int
    workers_to: int
    reason: str
    min_workers: NotRequired[int]


class WorkerFloorData(TypedDict):
    """A job with a worker range went below its MIN running workers (`below`), or back
    to MIN; `held`: training tasks wait meanwhile (the PS strategy; an allreduce group
    goes on with its members)."""

    running: int
    min: int
    below: bool
    held: bool


class GrowthData(TypedDict):
    """The throughput policy (scale_policy='throughput') measured the job at `workers`
    running workers (`samples_per_s`; `gain`: its share over one worker fewer) and now
    asks for `asked`; `holding`: it stopped growing; `reason` says it in words ('holding
    at 3: the 4th added 2 %'). Without a measurement: the policy (re)starts at `asked`."""

    workers: int
    asked: int
    holding: bool
    reason: str
    samples_per_s: NotRequired[float]
    gain: NotRequired[float]


class RelaunchData(TypedDict, total=False):
    """An instance is relaunched (a worker under a new id, a PS under its own), with the
    crash budget spent so far; `promoted`: a standby worker, ready already, took the lost
    one's place (no new process or pod for it)."""

    role: Required[str]
    id: Required[int]
    replaces: Required[int]
    reason: str
    worker_crashes: int
    ps_crashes: int
    promoted: bool


class RelaunchRefusedData(TypedDict, total=False):
    """An instance is not relaunched: the crash budget is spent."""

    role: Required[str]
    id: Required[int]
    reason: str
    worker_crashes: int
    ps_crashes: int


class RequeueData(TypedDict, total=False):
    """Minibatches of an epoch go back to the queue: a worker's unfinished task
    (`worker`, `task`, `kind`), a source's batches not applied on every PS (`source`,
    `reason`), or (allreduce, every replica lost) what came after the replicas'
    checkpoint (`reason`, `checkpoint_step`)."""

    epoch: int
    batches: int
    worker: int
    task: int
    kind: str
    source: int
    reason: str
    checkpoint_step: int


class PsRestoredData(TypedDict):
    """A relaunched PS restored a checkpoint; the updates after it were rolled back and
    are redone."""

    ps: int
    restored_version: int
    newest_seen_version: int
    updates_rolled_back: int


class ExportData(TypedDict, total=False):
    """The trained model was written: `path` ("" with export_format saved_model);
    `saved_model`: the SavedModel's folder (export_format saved_model or both); `tables`:
    true when the embedding tables were too large for a Keras file and `path` holds
    their (id, vector) files."""

    path: Required[str]
    worker: int
    saved_model: str
    tables: bool


class PredictionTaskData(TypedDict):
    """One prediction task's outputs were written: `records` of the prediction data's
    `source` from `start`, by `worker`."""

    worker: int
    source: int
    start: int
    records: int


class PredictionsData(TypedDict):
    """Every record of the prediction data has its prediction: `records` in all, written
    under `path` (`Job.predictions()` reads them in the data's order)."""

    path: str
    records: int


class CheckpointData(TypedDict, total=False):
    """The PS checkpointed these versions (`final`: the job's last)."""

    versions: Required[list]
    final: bool


class LearningRateData(TypedDict, total=False):
    """A callback set the learning rate of every update from now on (PS: of the pushes of
    tasks handed out from now on; allreduce: from the first step a member holds it);
    `set` counts the settings, `by` names the callback."""

    rate: Required[float]
    set: int
    by: str
    epoch: int | None
    step: int


class CallbackData(TypedDict):
    """The master called the model's callbacks (all but `on_train_batch_end`); a master
    that takes the job over calls them again to rebuild their state."""

    hook: str
    args: Any
    logs: Any


class TrainingStoppedData(TypedDict, total=False):
    """A callback stopped training (`reason`: which, when); `dropped` training tasks were
    not started. The job evaluates, exports and succeeds."""

    reason: Required[str]
    epoch: int
    step: int
    dropped: int


class TablesData(TypedDict):
    """The PS embedding tables changed (polled every few seconds and before the job
    ends): per table the sums over the PS of `rows` held, the `bytes` they hold (rows ×
    each row's vector, optimizer slots, id and version), the `allocated_bytes` (whole
    blocks of rows and the index: the memory taken), rows `created` and `evicted`,
    gradients `refused` by admission; `ps_rows`: rows held per PS."""

    tables: dict
    ps_rows: Any


class GroupData(TypedDict, total=False):
    """(allreduce) A new group version: its `members`, their `addresses`, who `joined`
    and `left`, and why (`reason`, a `GroupChange`). After a failure the `step`, how long
    the survivors took to agree (`agreed_s`), the `causes` and the decision (`failed`,
    `source`, `behind`, `joiners`); when every member was lost (`restored`) and when the
    next group forms, `restore` (the replicas' checkpoint) and `step`."""

    version: Required[int]
    members: Required[list]
    addresses: list
    joined: list
    left: list
    reason: Required[str]
    step: int
    agreed_s: float
    causes: dict
    failed: int
    source: Any
    behind: list
    joiners: list
    restore: str


class MasterRestartedData(TypedDict, total=False):
    """A new master took the job over from one that died, whose journal had `continued`
    events: it started from the snapshot of the state after event `snapshot` - 1 (0:
    none, from the start) and replayed the `replayed` events after it, in `rebuild_s`,
    `down_s` after the last event of the one that died; `adopted` instances went on in
    their processes."""

    incarnation: Required[int]
    pid: int
    replayed: int
    snapshot: int
    continued: int
    rebuild_s: float
    down_s: float
    adopted: int


class QueueData(TypedDict, total=False):
    """A change to the task queue (`op`: add_epoch, next_for, report, finish,
    release_worker, requeue_batches, settle, add_evaluation, add_export) with its
    arguments, the `task` handed out and the request (`worker`, `seq`): the master's
    record of its tasks, which a new master replays. Each op has arguments of its own,
    so the fields beyond these are open."""

    op: Required[str]
    task: Any
    worker: int
    seq: int


class EvaluationTaskData(TypedDict):
    """One evaluation task's metric states (name -> its variables as lists), summed into
    its round."""

    round: int
    worker: int
    states: dict


class GroupSettledData(TypedDict, total=False):
    """(allreduce) The group stepped again `seconds` after a change (`cause`)."""

    version: Required[int]
    step: int
    seconds: float
    cause: str
    completed_at: float
    worker: int


class JournalCompactedData(TypedDict, total=False):
    """The events before `before` were compacted (runtime/master/compaction.py): the
    master's snapshot stands for them, and the journal keeps of them every event of a
    kind kept whole, a thinned kind's thinned (`thinned`: how many of those it holds,
    at most `thin_cap` each, evenly spread), none of a dropped kind (`dropped`: how many
    went, in all); `kept` events are left before `before`, in `seconds` of work."""

    before: Required[int]
    kept: int
    dropped: int
    thinned: dict
    thin_cap: int
    seconds: float


class PeerUnreachableData(TypedDict, total=False):
    """`by` ("worker 3", "master") could not reach `peer` ("ps-0") for `seconds` (the
    longest of `times` spells since it last said so): its calls failed or went unanswered
    until the peer answered again (`healed`) or it gave up on the peer; `detail` is what
    the last failed call said."""

    by: Required[str]
    peer: Required[str]
    seconds: float
    times: int
    healed: bool
    detail: str


class MasterSaturatedData(TypedDict, total=False):
    """The master is behind its workers (runtime/master/saturation.py): since its last
    look it turned `turned_away` calls away (it holds at most `max_calls` at once, on
    `threads` threads), or one waited `longest_wait_s` for a thread. `calls` are held
    now, `waiting` of them for a thread; it served `calls_per_s`. Its callers wait their
    turn and try again; no worker is given up on for silence while it is behind."""

    calls: int
    waiting: int
    max_calls: int
    threads: int
    turned_away: int
    longest_wait_s: float
    calls_per_s: float


class MasterCaughtUpData(TypedDict, total=False):
    """The master keeps up again, after `seconds` behind: it served `served` calls then
    (`calls_per_s`), turned `turned_away` away, and the longest wait for a thread was
    `longest_wait_s`."""

    seconds: float
    served: int
    turned_away: int
    longest_wait_s: float
    calls_per_s: float


# -------------------------------------------------------------------- the kinds


class EventKind(StrEnum):
    """The kinds of event in a job's journal, each with its payload type (`payload`);
    docs/events.md's table is these, in this order."""

    payload: type

    def __new__(cls, value: str, payload: type) -> "EventKind":
        member = str.__new__(cls, value)
        member._value_ = value
        member.payload = payload
        return member

    JOB_STATE = "job_state", JobStateData
    PROGRESS = "progress", ProgressData
    LOSS = "loss", LossData
    WORKER_TIME = "worker_time", WorkerTimeData
    STRAGGLER = "straggler", StragglerData
    STRAGGLER_CLEARED = "straggler_cleared", StragglerClearedData
    PHASE = "phase", PhaseData
    EPOCH = "epoch", EpochData
    EVALUATION_STARTED = "evaluation_started", EvaluationStartedData
    EVALUATION = "evaluation", EvaluationData
    INSTANCE = "instance", InstanceData
    PENDING_TOO_LONG = "pending_too_long", PendingTooLongData
    MEMORY_RAISED = "memory_raised", MemoryRaisedData
    SCALE = "scale", ScaleData
    WORKER_FLOOR = "worker_floor", WorkerFloorData
    GROWTH = "growth", GrowthData
    RELAUNCH = "relaunch", RelaunchData
    RELAUNCH_REFUSED = "relaunch_refused", RelaunchRefusedData
    REQUEUE = "requeue", RequeueData
    PS_RESTORED = "ps_restored", PsRestoredData
    PREDICTION_TASK = "prediction_task", PredictionTaskData
    PREDICTIONS = "predictions", PredictionsData
    EXPORT = "export", ExportData
    CHECKPOINT = "checkpoint", CheckpointData
    LEARNING_RATE = "learning_rate", LearningRateData
    CALLBACK = "callback", CallbackData
    TRAINING_STOPPED = "training_stopped", TrainingStoppedData
    TABLES = "tables", TablesData
    GROUP = "group", GroupData
    MASTER_RESTARTED = "master_restarted", MasterRestartedData
    QUEUE = "queue", QueueData
    EVALUATION_TASK = "evaluation_task", EvaluationTaskData
    GROUP_SETTLED = "group_settled", GroupSettledData
    PEER_UNREACHABLE = "peer_unreachable", PeerUnreachableData
    JOURNAL_COMPACTED = "journal_compacted", JournalCompactedData
    MASTER_SATURATED = "master_saturated", MasterSaturatedData
    MASTER_CAUGHT_UP = "master_caught_up", MasterCaughtUpData

    @property
    def fields(self) -> dict[str, Any]:
        """Each field of this kind's data and its type."""
        return get_type_hints(self.payload)

    @property
    def required(self) -> frozenset[str]:
        return self.payload.__required_keys__

    @property
    def meaning(self) -> str:
        """What an event of this kind says (its payload's docstring, on one line)."""
        return " ".join((self.payload.__doc__ or "").split())


# The kinds whose data may hold fields beyond their payload's (each queue op its own).
OPEN_KINDS = frozenset({EventKind.QUEUE})

# What the journal keeps of the events a master's snapshot stands for (compaction.py):
# none of the kinds whose facts the snapshot holds; a thinned sample of the kinds a
# job writes all the time (evenly spread: THIN_CAP of each at most); the rest whole
# (their number grows with the job's epochs, evaluations and faults, not its hours).
DROPPED_KINDS = frozenset({EventKind.QUEUE, EventKind.EVALUATION_TASK})
THINNED_KINDS = frozenset(
    {EventKind.LOSS, EventKind.PROGRESS, EventKind.WORKER_TIME, EventKind.CHECKPOINT,
     EventKind.TABLES, EventKind.MASTER_SATURATED, EventKind.MASTER_CAUGHT_UP}
)  # fmt: skip
THIN_CAP = 4096


# -------------------------------------------------------------------- the event


@dataclass(frozen=True)
class Event:
    """One fact of the journal: its number (from 0), when (Unix seconds), its kind and
    its data (the kind's payload)."""

    seq: int
    time: float
    kind: EventKind
    data: dict[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EventKind):  # a plain string off the wire or a file
            object.__setattr__(self, "kind", EventKind(self.kind))

    def to_json(self, more: bool = False) -> str:
        """The event as a line of the journal file; `more`: a transaction's line that is
        not its last."""
        raw: dict[str, Any] = {"seq": self.seq, "time": self.time, "kind": self.kind}
        raw["data"] = self.data
        if more:
            raw[MORE] = True
        return json.dumps(raw, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "Event":
        raw = json.loads(line)
        return cls(raw["seq"], raw["time"], raw["kind"], raw["data"])


MORE = "more"  # on a line of the file: the transaction it belongs to goes on after it

P = TypeVar("P")


def payload(event: Event, kind_of_data: type[P]) -> P:
    """The event's data as its payload type, for a reader that wants its fields typed:
    `payload(event, ScaleData)["workers_to"]`."""
    if event.kind.payload is not kind_of_data:
        raise TypeError(f"a {event.kind} event's data is {event.kind.payload.__name__}")
    return event.data  # type: ignore[return-value]


# -------------------------------------------------------------------- checks and docs

_PLAIN = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,)}


def payload_problems(kind: "EventKind | str", data: dict[str, Any]) -> list[str]:
    """Where `data` strays from `kind`'s payload: a required field missing, a field the
    payload does not name, a value of another type ([] when it conforms)."""
    kind = EventKind(kind)
    fields = kind.fields
    problems = [f"{kind}: no {name!r}" for name in sorted(kind.required - set(data))]
    for name, value in data.items():
        if name not in fields:
            if kind not in OPEN_KINDS:
                problems.append(f"{kind}: {name!r} is not a field of {kind.payload.__name__}")
            continue
        if not _conforms(value, fields[name]):
            problems.append(f"{kind}: {name!r} = {value!r} is not {fields[name]}")
    return problems


def _conforms(value: Any, hint: Any) -> bool:
    options = getattr(hint, "__args__", None) if type(hint).__name__ == "UnionType" else None
    if options is not None:
        return any(_conforms(value, option) for option in options)
    if hint is type(None):
        return value is None
    if hint in _PLAIN:
        # (a bool is an int to isinstance, never to a reader)
        return isinstance(value, _PLAIN[hint]) and (hint is bool or not isinstance(value, bool))
    if hint is dict:
        return isinstance(value, dict)
    return True  # Any


def _type_name(hint: Any) -> str:
    """`int`, `float or None`, `any` ("|" would end a cell of a Markdown table)."""
    if type(hint).__name__ == "UnionType":
        return " or ".join(_type_name(option) for option in hint.__args__)
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", "any").replace("Any", "any")


def event_table() -> str:
    """docs/events.md's table of event kinds, in Markdown: each kind, its fields with
    their types (the ones always there in bold), what it means, and what the journal
    keeps of it once compacted (`kept`: whole, thinned, dropped)."""
    rows = ["| kind | data | meaning | kept |", "|---|---|---|---|"]
    for kind in EventKind:
        always = [name for name in kind.fields if name in kind.required]
        named = [f"**`{name}`**" for name in always]
        named += [f"`{name}`" for name in kind.fields if name not in kind.required]
        fields = ", ".join(
            f"{name} {_type_name(hint)}"
            for name, hint in zip(named, [kind.fields[n.strip("*`")] for n in named])
        )
        kept = (
            "dropped" if kind in DROPPED_KINDS else "thinned" if kind in THINNED_KINDS else "whole"
        )
        rows.append(f"| `{kind}` | {fields} | {kind.meaning} | {kept} |")
    return "\n".join(rows)
