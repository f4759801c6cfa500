"""The elastic policy: how many workers and PS should run, and what to do when one ends.

The same for every backend: the launcher only starts, kills and reports. Here we decide
- workers: scale to the desired count; a crashed worker is replaced under a new id while
  the crash budget lasts, a preempted one always; when none is left and none may be
  started, the job fails;
- a worker range (`min_workers`): the first MIN workers are launched at the base
  priority and the rest `elastic` (the backend's lowest priority, so a scheduler preempts
  them first); a replacement takes the tier its job lacks; scaling down retires elastic
  workers first. Whether enough run to train is the worker floor's (`worker_floor.py`);
- standby workers (`standby`): that many more workers start, at the lowest priority,
  get ready (model built, step traced) and are given no work; a lost worker's place goes
  to one of them at once (`promoted`), and another standby starts in its place;
- parameter servers: a lost PS is relaunched under the same id (so it owns the same
  shard) and restores its newest checkpoint; until it reports where it serves, the
  master gives no address for it (`on_ps_lost`);
- out of memory: the replacement gets more (up to a cap, where the backend has limits);
- pending too long (unschedulable, image not pulled): the journal says so; the job goes
  on with the workers it has, and fails if it is a PS that cannot start;
- a worker or PS that found a peer's address served by something else (exit code
  WRONG_PEER_EXIT): the job fails with its reason, since a replacement would find the same.

A master that replaces one that died rebuilds the table from the journal (`replay`) and
then takes over what the backend still runs (`resume`): the instances go on untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticdl_nb.runtime.exit_codes import USER_CODE_EXIT, WRONG_PEER_EXIT
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.site import EventSink, InstanceEvent, InstanceLauncher
from elasticdl_nb.vocabulary import (
    INSTANCE_ENDED,
    MASTER_END_STATES,
    EventKind,
    InstanceState,
    Role,
)

log = logging.getLogger("elasticdl_nb.master")

KILL_TRIES, KILL_RETRY_SECONDS = 5, 2.0  # `end_soon`: a busy API server's refusals

# Makes the launcher that reports to the given sink (`MasterSite.launcher`, its
# environment bound): the instance manager makes its launcher with its own `on_event`.
LauncherFor = Callable[[EventSink], InstanceLauncher]


@dataclass
class Instance:
    role: Role
    instance_id: int
    state: str = InstanceState.STARTED
    pid: int | None = None
    exit_reason: str = ""
    expected_exit: bool = False  # we asked it to stop
    replaces: int | None = None
    waiting: str = ""  # why it has not started yet (pending events)
    elastic: bool = False  # a worker above its range's MIN: launched at the lowest priority
    standby: bool = False  # ready, given no work, for a lost worker's place (lowest priority)
    asked: bool = False  # (a standby) it has asked for work: built and ready


@dataclass
class InstanceCounts:
    worker_crashes: int = 0
    ps_crashes: int = 0
    preemptions: int = 0
    relaunches: dict[str, int] = field(default_factory=lambda: {Role.WORKER: 0, Role.PS: 0})


class InstanceManager:
    """The job's workers and PS: which should run, which do, and what each one's end
    means (the policy in the module docstring). It hears every instance event from the
    launcher it makes (`launcher_for(self.on_event)`) and tells the master what matters
    through the callbacks it is given: `on_worker_lost`, `on_ps_lost`, `on_job_failed`.

    Threading: the launcher's threads call `on_event`, the master's threads the rest;
    everything runs under `lock`, which is the master's own (`JobMaster.lock`): the
    callbacks take it, and the master calls in here holding it, so two locks would
    deadlock (seen under load in a fault test). Timers (retiring a worker, pending too
    long) run on their own threads and take the lock too.
    """

    # What a snapshot holds (snapshot.py): what `replay` sets, from `snapshot_state`.
    STATE = (
        "desired_workers", "min_workers", "shutting_down", "counts", "instances",
        "_next_worker_id",
    )  # fmt: skip

    def __init__(
        self,
        launcher_for: LauncherFor,
        journal: Journal,
        *,
        workers: int,
        ps: int,
        min_workers: int = 0,
        max_worker_relaunches: int,
        max_ps_relaunches: int,
        standby: int = 0,
        on_worker_lost: Callable[[int], None],
        on_ps_lost: Callable[[int], None] = lambda ps_id: None,
        on_job_failed: Callable[[str], None],
        on_work_for: Callable[[], None] = lambda: None,
        lock: threading.RLock | None = None,
        pending_timeout: float = 600.0,
        log_tail: Callable[[str, int, int], str] = lambda role, instance_id, lines: "",
        ceiling: Callable[[], int | None] = lambda: None,
    ):
        self.journal = journal
        self.desired_workers = workers
        self.min_workers = min_workers  # a range's MIN (0: a fixed number)
        self.num_ps = ps
        self.max_worker_relaunches = max_worker_relaunches
        self.max_ps_relaunches = max_ps_relaunches
        self.standby_workers = standby  # how many to keep ready
        self._on_worker_lost = on_worker_lost
        self._on_ps_lost = on_ps_lost
        self._on_job_failed = on_job_failed
        self._on_work_for = on_work_for  # a standby may take work now: wake its ask
        self.pending_timeout = pending_timeout
        self._log_tail = log_tail  # (role, id, lines) -> the end of that instance's log
        self._ceiling = ceiling  # the most to ask for now, below MAX (growth.py), or None
        self.instances: dict[tuple[str, int], Instance] = {}
        self.counts = InstanceCounts()
        self._next_worker_id = 0
        self._lock = lock or threading.RLock()  # the master's (see the class docstring)
        self.shutting_down = False
        self._adopting = False  # (resume: the backend reports what it still has)
        self.launcher = launcher_for(self.on_event)  # last: it may report at once

    # ------------------------------------------------------------------ queries

    def live(self, role: Role) -> list[Instance]:
        with self._lock:
            return [
                i
                for i in self.instances.values()
                if i.role == role and i.state not in INSTANCE_ENDED
            ]

    def active_workers(self) -> list[int]:
        """Workers that are running and not being retired (nor standing by)."""
        return [
            i.instance_id for i in self.live(Role.WORKER) if not i.expected_exit and not i.standby
        ]

    def standby_ids(self) -> list[int]:
        """Standby workers that are started or running."""
        return [i.instance_id for i in self.live(Role.WORKER) if i.standby and not i.expected_exit]

    def stands_by(self, worker_id: int) -> bool:
        """Whether the worker is a standby, which asks for work only to be told to wait
        (a standby that asks is ready: it is the first to take a lost worker's place)."""
        with self._lock:
            inst = self.instances.get((Role.WORKER, worker_id))
            if inst is None or not inst.standby:
                return False
            inst.asked = True
            return True

    def pending_workers(self) -> dict[int, str]:
        """Workers waiting to be scheduled or started, and why (the scheduler's words)."""
        with self._lock:
            return {
                i.instance_id: i.waiting
                for i in self.live(Role.WORKER)
                if i.state == InstanceState.PENDING and not i.expected_exit and not i.standby
            }

    def wanted(self, worker_id: int) -> bool:
        """Whether the worker is to stay: known, not retiring, not ended (a standby too)."""
        with self._lock:
            inst = self.instances.get((Role.WORKER, worker_id))
            return inst is not None and not inst.expected_exit and inst.state not in INSTANCE_ENDED

    def takes_work(self, worker_id: int) -> bool:
        """Whether the worker may be given tasks: known, not retiring, not ended, and
        not standing by (a promoted standby keeps its pod's lowest priority). A
        dead worker's GetTask can still be in the master's hands (sent just before it
        died, waiting for work): a task given to it then would be lost for good."""
        with self._lock:
            inst = self.instances.get((Role.WORKER, worker_id))
            return self.wanted(worker_id) and not inst.standby

    def table(self) -> list[dict]:
        with self._lock:
            return [
                {
                    "role": i.role,
                    "id": i.instance_id,
                    "state": i.state,
                    "pid": i.pid,
                    "exit_reason": i.exit_reason,
                    **({"standby": True} if i.standby else {}),
                }
                for i in self.instances.values()
            ]

    # ------------------------------------------------------------------ actions

    def start(self) -> None:
        for ps_id in range(self.num_ps):
            self._launch(Role.PS, ps_id)
        self.scale(self.desired_workers, reason="job start", min_workers=self.min_workers)

    def scale(self, workers: int, reason: str = "requested", min_workers: int = 0) -> dict:
        """Ask for `workers` workers (a range's MAX, with its MIN in `min_workers`)."""
        with self._lock:
            before = len(self.active_workers())
            self.desired_workers, self.min_workers = workers, min_workers
            ranged = {"min_workers": min_workers} if min_workers else {}
            self.journal.append(
                EventKind.SCALE, workers_from=before, workers_to=workers, reason=reason, **ranged
            )
            self._converge()
            return {"workers_from": before, "workers_to": workers, **ranged}

    @property
    def asked_workers(self) -> int:
        """How many workers the job asks for now: the desired count, or fewer while a
        growth policy holds it below (growth.py)."""
        ceiling = self._ceiling()
        return self.desired_workers if ceiling is None else min(ceiling, self.desired_workers)

    def converge(self) -> None:
        with self._lock:
            self._converge()

    def _converge(self) -> None:
        """Start or retire workers until the active count is the asked count; the
        elastic ones retire first, the newest first."""
        if self.shutting_down:
            return
        active, asked = self.active_workers(), self.asked_workers
        for _ in range(asked - len(active)):
            self._launch(Role.WORKER, self._take_worker_id())
        for _ in range(self.standby_workers - len(self.standby_ids())):
            self._launch(Role.WORKER, self._take_worker_id(), standby=True)
        extra = max(0, len(active) - asked)
        by_tier = sorted(
            active, key=lambda w: (self.instances[(Role.WORKER, w)].elastic, w), reverse=True
        )
        for worker_id in by_tier[:extra]:
            self.retire(worker_id)

    def _elastic_next(self) -> bool:
        """Whether the next worker launched is elastic: its job's range has MIN base
        workers already (not retiring, not ended)."""
        if not self.min_workers:
            return False
        base = [w for w in self.active_workers() if not self.instances[(Role.WORKER, w)].elastic]
        return len(base) >= self.min_workers

    def retire(self, worker_id: int) -> None:
        """Ask a worker to stop after its current minibatch (it learns so on its next report)
        and kill it if it has not gone in 30 s."""
        with self._lock:
            inst = self.instances.get((Role.WORKER, worker_id))
            if inst is None or inst.expected_exit:
                return
            inst.expected_exit = True
            self.journal.append(
                EventKind.INSTANCE, role=Role.WORKER, id=worker_id, kind=InstanceState.RETIRING
            )
        self.end_soon(Role.WORKER, worker_id, after=30)

    def end_soon(self, role: Role, instance_id: int, after: float = 0.0) -> None:
        """Kill an instance (it is replaced like one that died), `after` seconds from now,
        from a thread of its own: on Kubernetes a kill is an API call, which a busy API
        server may take seconds to answer or refuse, and the callers hold the job's lock.
        A kill that fails is tried again, then logged: it must not end the job."""

        def kill() -> None:
            for attempt in range(1, KILL_TRIES + 1):
                if attempt > 1:
                    time.sleep(KILL_RETRY_SECONDS)
                try:
                    self.launcher.kill(role, instance_id, True)
                    return
                except Exception as exc:  # noqa: BLE001 - said, and tried again
                    log.warning("could not end %s %d (try %d): %s", role, instance_id, attempt, exc)
            log.error("gave up ending %s %d after %d tries", role, instance_id, KILL_TRIES)

        timer = threading.Timer(after, kill)
        timer.daemon = True
        timer.start()

    def _take_worker_id(self) -> int:
        worker_id = self._next_worker_id
        self._next_worker_id += 1
        return worker_id

    def _launch(
        self, role: Role, instance_id: int, replaces: int | None = None, standby: bool = False
    ) -> None:
        with self._lock:
            elastic = standby or (role == Role.WORKER and self._elastic_next())
            inst = self._known(role, instance_id, replaces)
            inst.elastic, inst.standby = elastic, standby
        self.launcher.launch(role, instance_id, elastic=elastic)

    def shutdown(self, grace_seconds: float = 5.0, drain_seconds: float = 3.0) -> None:
        """End every instance: workers first get `drain_seconds` to see that the job is
        over and exit on their own (they ask for work every 0.2 s), then everything left
        gets SIGTERM, and SIGKILL after `grace_seconds`."""
        with self._lock:
            self.shutting_down = True
            for inst in self.instances.values():
                inst.expected_exit = True
        deadline = time.monotonic() + drain_seconds
        while self.live(Role.WORKER) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.launcher.shutdown(grace_seconds)

    # ------------------------------------------------------------------ events

    def on_event(self, event: InstanceEvent) -> None:
        """Every instance event from the backend: journal it, then apply the policy. One
        journal transaction: a master that dies midway must not leave a new one the end
        of a worker without the requeue of its tasks (they would wait forever)."""
        with self._lock, self.journal.transaction():
            inst = self.instances.get((event.role, event.instance_id))
            if inst is None and self._adopting:  # started just before the old master died
                inst = self._known(event.role, event.instance_id)
            if inst is None or inst.state in INSTANCE_ENDED:
                return  # not ours, or ended already: an instance ends once
            if self._adopting and not event.ended:  # still there, as the journal says
                inst.pid = event.pid or inst.pid
                return
            if event.kind == InstanceState.PENDING:
                if inst.state != InstanceState.PENDING:
                    self._watch_pending(inst)
                inst.waiting = event.reason
            inst.state = event.kind
            if event.pid:
                inst.pid = event.pid
            if event.ended:
                inst.exit_reason = event.reason or event.kind
            tier = {"elastic": True} if inst.elastic else {}
            if inst.standby:
                tier["standby"] = True
            self.journal.append(
                EventKind.INSTANCE, **event.to_dict(), expected=inst.expected_exit, **tier
            )
            if not event.ended or self.shutting_down:
                return
            if event.kind == InstanceState.FAILED and event.exit_code == WRONG_PEER_EXIT:
                self._on_job_failed(
                    f"{inst.role} {inst.instance_id} reached the wrong server. "
                    f"{self._last_lines(inst, 3)}"
                )
                return
            if event.role == Role.WORKER:
                self._worker_ended(inst, event)
            else:
                self._ps_ended(inst, event)

    def _worker_ended(self, inst: Instance, event: InstanceEvent) -> None:
        self._on_worker_lost(inst.instance_id)
        if inst.standby:  # it held no work: another takes its place in reserve
            if event.kind not in (InstanceState.PREEMPTED, InstanceState.DELETED):
                self.counts.worker_crashes += 1
            if self.counts.worker_crashes <= self.max_worker_relaunches or inst.expected_exit:
                self._converge()
            return
        if inst.expected_exit or event.kind == InstanceState.SUCCEEDED:
            self._converge()
            return
        if event.kind == InstanceState.FAILED and event.exit_code == USER_CODE_EXIT:
            return  # the worker reported the error; the job fails on that report
        if event.kind == InstanceState.PREEMPTED:
            self.counts.preemptions += 1
        elif event.kind == InstanceState.OOM and self._more_memory(Role.WORKER, inst):
            pass  # not the worker's fault: it gets more memory, and no crash is counted
        else:
            self.counts.worker_crashes += 1
            if self.counts.worker_crashes > self.max_worker_relaunches:
                self.journal.append(
                    EventKind.RELAUNCH_REFUSED,
                    role=Role.WORKER,
                    id=inst.instance_id,
                    reason=f"crash budget of {self.max_worker_relaunches} relaunches used up",
                    **self._crashes(),
                )
                if not self.active_workers():
                    self._on_job_failed(
                        f"worker {inst.instance_id} {inst.exit_reason}, and the budget of "
                        f"{self.max_worker_relaunches} worker relaunches is used up. "
                        f"{self._last_lines(inst)}"
                    )
                return
        self.counts.relaunches[Role.WORKER] += 1
        standby = self._ready_standby()
        if standby is not None:  # ready already: its place in reserve is filled anew
            standby.standby, standby.replaces = False, inst.instance_id
            self._journal_relaunch(inst, standby.instance_id, promoted=True)
            self._on_work_for()
            self._converge()
            return
        new_id = self._take_worker_id()
        self._journal_relaunch(inst, new_id)
        self._launch(Role.WORKER, new_id, replaces=inst.instance_id)

    def _journal_relaunch(self, lost: Instance, new_id: int, **more: bool) -> None:
        """The journal's word that `new_id` takes lost's place, with the budget spent."""
        self.journal.append(
            EventKind.RELAUNCH,
            role=lost.role,
            id=new_id,
            replaces=lost.instance_id,
            reason=lost.exit_reason,
            **more,
            **self._crashes(),
        )

    def _ready_standby(self) -> Instance | None:
        """The standby to take a lost worker's place: one that asked for work (ready),
        else one that runs, else one that was started; None if there is none."""
        waiting = [self.instances[(Role.WORKER, w)] for w in self.standby_ids()]
        order = {InstanceState.RUNNING: 1}
        waiting.sort(key=lambda i: (i.asked, order.get(i.state, 0), -i.instance_id))
        return waiting[-1] if waiting else None

    def _ps_ended(self, inst: Instance, event: InstanceEvent) -> None:
        if inst.expected_exit:
            return
        self._on_ps_lost(inst.instance_id)
        if event.kind == InstanceState.PREEMPTED or (
            event.kind == InstanceState.OOM and self._more_memory(Role.PS, inst)
        ):
            pass  # not the PS's fault: no crash is counted
        else:
            self.counts.ps_crashes += 1
        if self.counts.ps_crashes > self.max_ps_relaunches:
            self._on_job_failed(
                f"PS {inst.instance_id} {inst.exit_reason}, and the budget of "
                f"{self.max_ps_relaunches} PS relaunches is used up. {self._last_lines(inst)}"
            )
            return
        self.counts.relaunches[Role.PS] += 1
        self._journal_relaunch(inst, inst.instance_id)
        self._launch(Role.PS, inst.instance_id, replaces=inst.instance_id)

    # ------------------------------------------------------------------ a new master

    def replay(self, kind: str, data: dict) -> None:
        """What an earlier master of this job journaled about its instances: the table,
        the desired count, the relaunch budget spent (`recovery.py`). Nothing is launched."""
        if kind == EventKind.SCALE:
            self.desired_workers = data["workers_to"]
            self.min_workers = data.get("min_workers", 0)
        elif kind == EventKind.JOB_STATE and data["state"] in MASTER_END_STATES:
            self.shutting_down = True
        elif kind in (EventKind.RELAUNCH, EventKind.RELAUNCH_REFUSED):
            self.counts.worker_crashes = data.get("worker_crashes", self.counts.worker_crashes)
            self.counts.ps_crashes = data.get("ps_crashes", self.counts.ps_crashes)
            if kind == EventKind.RELAUNCH:
                self.counts.relaunches[data["role"]] += 1
                promoted = self.instances.get((data["role"], data["id"]))
                if data.get("promoted") and promoted is not None:
                    promoted.standby, promoted.replaces = False, data["replaces"]
                else:
                    self._known(data["role"], data["id"], replaces=data["replaces"])
        elif kind == EventKind.INSTANCE and "address" not in data:  # (not a PS's own ready)
            inst = self.instances.get((data["role"], data["id"])) or self._known(
                data["role"], data["id"]
            )
            if data["kind"] == InstanceState.RETIRING:
                inst.expected_exit = True
            elif inst.state not in INSTANCE_ENDED:
                inst.state = InstanceState(data["kind"])
                inst.pid = data.get("pid") or inst.pid
                inst.expected_exit |= data.get("expected", False)
                inst.elastic |= data.get("elastic", False)
                inst.standby = data.get("standby", False)
                if inst.state == InstanceState.PENDING:
                    inst.waiting = data.get("reason", "")
                if inst.state in INSTANCE_ENDED:
                    inst.exit_reason = data.get("reason") or inst.state

    def resume(self) -> int:
        """On a master that took over (its table replayed): take over the instances the
        backend still has, as they are now (those that ended meanwhile are handled as any
        end), and start the ones the old master launched but the backend never heard of.
        Returns how many instances the backend still had."""
        with self._lock:
            self._adopting = True
        try:
            known = self.launcher.adopt()
        finally:
            with self._lock:
                self._adopting = False
        with self._lock:
            for (role, instance_id), inst in list(self.instances.items()):
                if inst.state not in INSTANCE_ENDED and (role, instance_id) not in known:
                    if not self.shutting_down:
                        log.info("%s %d was never started: starting it", role, instance_id)
                        self._launch(role, instance_id, replaces=inst.replaces)
            self._converge()
        return len(known)

    def _known(self, role: str, instance_id: int, replaces: int | None = None) -> Instance:
        """A fresh entry in the table (a launch, or one found in the journal or backend)."""
        inst = self.instances[(role, instance_id)] = Instance(
            Role(role), instance_id, replaces=replaces
        )
        if role == Role.WORKER:
            self._next_worker_id = max(self._next_worker_id, instance_id + 1)
        return inst

    # ------------------------------------------------------------------ helpers

    def _crashes(self) -> dict:
        """The crash budget spent so far, as relaunch events carry it."""
        return {
            "worker_crashes": self.counts.worker_crashes,
            "ps_crashes": self.counts.ps_crashes,
        }

    def _more_memory(self, role: Role, inst: Instance) -> bool:
        """After an OOM kill: whether the backend gave the role's next instances more memory."""
        grown = self.launcher.grow_memory(role)
        if grown:
            self.journal.append(
                EventKind.MEMORY_RAISED, role=role, id=inst.instance_id, memory=grown
            )
        return bool(grown)

    def _last_lines(self, inst: Instance, lines: int = 10) -> str:
        tail = self._log_tail(inst.role, inst.instance_id, lines).strip()
        where = f"job.logs({str(inst.role)!r}, {inst.instance_id})"
        if not tail:
            return f"See its log with {where}."
        return f"The last lines of its log ({where}):\n{tail}"

    def _watch_pending(self, inst: Instance) -> None:
        """Tell the journal if `inst` is still waiting to start after pending_timeout."""

        def check(started_waiting: Instance = inst) -> None:
            with self._lock:
                if self.shutting_down or started_waiting.state not in (
                    InstanceState.PENDING,
                    InstanceState.STARTED,
                ):
                    return
                if self.instances.get((inst.role, inst.instance_id)) is not started_waiting:
                    return
                seconds = self.pending_timeout
                self.journal.append(
                    EventKind.PENDING_TOO_LONG,
                    role=inst.role,
                    id=inst.instance_id,
                    seconds=seconds,
                    reason=inst.waiting,
                )
                if inst.role == Role.PS:
                    self._on_job_failed(
                        f"PS {inst.instance_id} could not start within {seconds:g} s "
                        f"({inst.waiting}); the job cannot train without it."
                    )

        timer = threading.Timer(self.pending_timeout, check)
        timer.daemon = True
        timer.start()
