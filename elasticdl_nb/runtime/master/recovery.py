"""How a master that replaces one that died takes the job over: it reads the journal back.

The journal holds every fact the master acted on, written before it acted or answered
(see `journal.py`): each change to the task queue (`queue` events, replayed call by call:
`TaskQueue.replay`), epochs, phases, evaluation rounds and their tasks' metric states,
instance events, scale decisions and relaunches, where each PS serves, the allreduce
group's versions and decisions, the job's state. `rebuild` hands each event to the part
of the master that wrote it (each part's `replay`), which sets its state as it was and
does nothing else: no launch, no call, no event. Then `resume` turns to the world as it
is now: the instances the backend still has are taken over (`InstanceManager.resume`),
and the strategy checks what it holds against its peers (`TrainingStrategy.resumed`).

A long job's journal is compacted (`compaction.py`): the master before started from a
snapshot of its state (`snapshot.py`) and the events after it (`take_over`), which leave
it where replaying every event would.

What is not journaled is rebuilt empty: the throughput window of the last 10 s, timers
(an instance pending too long is noticed again at its next pending event).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master import snapshot as snapshots
from elasticdl_nb.runtime.master.journal import Event, Journal
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind, JobState

if TYPE_CHECKING:
    from elasticdl_nb.runtime.master.job_master import JobMaster

log = logging.getLogger("elasticdl_nb.master")


def rebuild(master: JobMaster, events: list[Event], snapshot: bytes | None = None) -> None:
    """Set `master` (new, nothing started) to where its job's journal `events` left it:
    from the start, or from a `snapshot` of an earlier master (`snapshot.py`) and the
    events after it."""
    started = time.monotonic()
    continued = events[-1].seq + 1 if events else 0
    with master.lock:
        after = snapshots.restore(master, snapshot) if snapshot is not None else 0
        events = [e for e in events if e.seq >= after]
        for event in events:
            _replay(master, event)
        master.incarnation = 1 + master.restarts  # (each one before journaled its own)
        master.decisions.replay_calls()
    master.rebuilt = {
        "incarnation": master.incarnation,
        "pid": os.getpid(),
        "replayed": len(events),
        "snapshot": after,  # the seq the snapshot stood for (0: none)
        "continued": continued,  # the journal's length it took over
        "rebuild_s": round(time.monotonic() - started, 6),
        "down_s": round(time.time() - events[-1].time, 3) if events else 0.0,
    }
    log.info("job rebuilt from %d events in %.3f s", len(events), master.rebuilt["rebuild_s"])


def take_over(master: JobMaster, files: JobDir, journal: Journal) -> None:
    """Rebuild the job as the master before this one left it: from its newest snapshot
    and the events after it, or from the whole journal when there is no snapshot (or
    one of another version, while the journal is whole). A journal cut with no snapshot
    of this version to stand for what it dropped cannot be taken over."""
    path = files.master_snapshot
    if path.exists():
        try:
            rebuild(master, journal.continued, snapshot=path.read_bytes())
            return
        except snapshots.SnapshotMismatch as exc:
            if journal.first:
                raise RuntimeError(f"this job cannot be taken over: {exc}") from exc
            log.warning("the snapshot is not this master's (%s): replaying the journal", exc)
    elif journal.first:
        raise RuntimeError(
            f"the journal {files.events} was compacted before event {journal.first}, and "
            f"the snapshot that stands for those events ({path}) is gone: this job "
            "cannot be taken over"
        )
    rebuild(master, journal.continued)


def resume(master: JobMaster) -> None:
    """After `rebuild`, with the master serving: take over the instances that are still
    there, start those it meant to run, and journal that this master took over."""
    adopted = master.instances.resume()
    master.strategy.resumed()
    with master.lock:
        master.journal.append(EventKind.MASTER_RESTARTED, **master.rebuilt, adopted=adopted)
        master.restarts += 1
    master.wake()


def _replay(master: JobMaster, event: Event) -> None:
    kind, data = event.kind, event.data
    if kind == EventKind.QUEUE:
        _replay_queue(master, data)
    elif kind == EventKind.JOB_STATE:
        _replay_state(master, event)
    elif kind == EventKind.EPOCH:
        master.epoch = data["epoch"]
    elif kind == EventKind.PHASE:
        master.phases.replay(data)
    elif kind == EventKind.MASTER_RESTARTED:
        master.restarts += 1
    elif kind == EventKind.LOSS and data["points"]:
        master.progress.loss_points = data["points"][-1][0]
    master.decisions.replay(kind, data)
    master.evaluations.replay(kind, data)
    master.instances.replay(kind, data)
    if master.growth:
        master.growth.replay(kind, data)
    master.strategy.replay(kind, data)


def _replay_queue(master: JobMaster, data: dict) -> None:
    """A change to the task queue, and what the master kept about the request behind it:
    the task a worker's numbered GetTask got, the newest report counted."""
    tags = master.queue.replay(data)
    seq = tags.get("seq")
    if not seq:
        return
    if data["op"] == "next_for":
        task = master.queue.doing[data["task"]].task
        master.desk.remember_task_given(data["worker_id"], seq, task.to_message())
    elif data["op"] == "report":
        master.desk.remember_report_counted(tags["worker"], seq)


def _replay_state(master: JobMaster, event: Event) -> None:
    state = JobState(event.data["state"])
    if event.data.get("reason") == "started":
        master.started = event.time
    master.state = state
    if state in MASTER_END_STATES:
        master.ended = event.time
        if state == JobState.FAILED:
            master.error = event.data.get("reason", "")
        master.finished.set()
