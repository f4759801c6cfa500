"""The master's part in an allreduce job (its `TrainingStrategy`): the group's versions,
and what a failure or a retirement means for the task queue.

The workers reduce among themselves (runtime/collective/ring.py); the master keeps who
is in the group (`GroupCoordinator`) and makes sure that records are applied exactly
once across a change:

- A member reports a step's minibatches only once the next step has completed, when
  every member is known to have applied it. So a dead member's reports are always
  true, but a survivor may hold minibatches it applied and has not reported yet: it
  sends them with its `ReportLost`.
- A member that dies is therefore not released at once (its unreported minibatches
  would go back to the queue and be applied twice): the release waits for the
  survivors' recovery, which first marks done every minibatch of a step the survivors
  end up applying, then gives the rest of the dead member's tasks back.
- A member with no survivors to speak for it cannot recover: every replica is lost. The
  job goes back to the replicas' newest checkpoint (runtime/collective/checkpoints.py):
  the queue keeps as done only what that checkpoint holds, the rest is trained again,
  and the group that the replacements form starts from it. With no checkpoint yet, the
  job fails saying so.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from contextlib import AbstractContextManager

from elasticdl_nb.runtime.collective import checkpoints
from elasticdl_nb.runtime.collective.coordinator import GroupCoordinator
from elasticdl_nb.runtime.collective.membership import Recovery, Report
from elasticdl_nb.runtime.collective.ring import Group, PeerLost
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.strategy import JobControl
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.vocabulary import INSTANCE_ENDED, EventKind, GroupChange, Role

log = logging.getLogger("elasticdl_nb.master")

JOIN_TIMEOUT = 300.0  # a joiner waits this long for a version (a failure may be settling)
AGREE_TIMEOUT = 60.0
RELEASE_AFTER = 60.0  # a dead member nobody recovers from is released after this


def group_message(group: Group, formed: dict[int, str]) -> pb.GroupInfo:
    """A version as members get it; one formed from nothing (`formed`: version -> the
    checkpoint it starts from) names the member that starts it."""
    starts = group.version in formed and group.members
    return pb.GroupInfo(
        version=group.version,
        members=[pb.GroupMember(worker=w, address=a) for w, a in group.members],
        state_from=group.members[0][0] if starts else -1,
        restore=formed.get(group.version, ""),
    )


class AllreduceGroup:
    """`TrainingStrategy` with allreduce: the group's versions and the accounts of its
    members. Its state is guarded by the master's lock, except `coordinator`, which has
    its own (a `join` or `report_lost` waits there for the other members)."""

    pushes_before_more_work = False
    # An allreduce member's feed asks again at once: its GetTask waited already.
    idle_wait_seconds = 0.0
    # A member that retires leaves with the group, at a step the group agrees on.
    stops_unwanted_on_report = False
    # The group goes on with the members it has (why: worker_floor.py).
    holds_below_floor = False
    gives_up_on_silent_workers = False

    def __init__(self, job: JobControl, expected_workers: int):
        self._job = job
        self.coordinator = GroupCoordinator(expected_workers, job.journal.append)
        self._deferred: dict[int, float] = {}  # dead member -> when it died
        # Survivors' accounts of minibatches they applied and had not reported yet.
        self._unreported: list[pb.StepMinibatch] = []
        self._recovered: set[int] = set()  # decisions carried out, by the version they made

    def held_still(self) -> AbstractContextManager:
        return self.coordinator.held()

    def snapshot_state(self) -> dict:
        """What `replay` sets (a master's snapshot: snapshot.py): the group's versions and
        decisions, and the dead members not recovered from yet."""
        return {
            "coordinator": self.coordinator.snapshot_state(),
            "deferred": sorted(self._deferred),
        }

    def restore_state(self, state: dict) -> None:
        self.coordinator.restore_state(state["coordinator"])
        now = time.monotonic()  # (as `replay` has them: dead as of the takeover)
        self._deferred = dict.fromkeys(state["deferred"], now)

    # ------------------------------------------------------------------ RPCs

    def join(self, worker: int, address: str) -> pb.GroupInfo:
        group = self.coordinator.join(worker, address, JOIN_TIMEOUT)
        return group_message(group, self.coordinator.formed)

    def get(self, version: int) -> pb.GroupInfo:
        return group_message(self.coordinator.group(version), self.coordinator.formed)

    def report_lost(self, r: pb.LostReport) -> pb.RecoveryPlan:
        with self._job.lock:
            self._unreported.extend(r.unreported)
        report = Report(r.worker_id, r.completed_step, r.holds_result)
        suspect = r.suspect if r.suspect >= 0 else None
        try:
            recovery = self.coordinator.report_lost(
                r.version, report, AGREE_TIMEOUT, suspect=suspect, cause=r.cause
            )
        except AssertionError as exc:  # e.g. the only holder of a step died in recovery
            self._job.fail(f"the allreduce group cannot recover consistently: {exc}")
            raise PeerLost(None, str(exc)) from None
        with self._job.lock, self._job.journal.transaction():  # (a new master: all or none)
            if recovery.group.version not in self._recovered:  # once per decision
                self._recovered.add(recovery.group.version)
                self._carry_out(recovery)
        return pb.RecoveryPlan(
            group=group_message(recovery.group, self.coordinator.formed),
            step=recovery.step,
            source=-1 if recovery.source is None else recovery.source,
            behind=list(recovery.behind),
            lost=list(recovery.lost),
            joiners=list(recovery.joiners),
        )

    def _carry_out(self, recovery: Recovery) -> None:
        """Under the master's lock, once per decision: what the survivors applied is
        done; the rest of the lost members' tasks goes back to the queue."""
        applied: dict[int, list[int]] = defaultdict(list)
        accounts, self._unreported = self._unreported, []  # (the next come after this)
        for m in accounts:
            if m.step <= recovery.step:
                applied[m.task_id].append(m.start)
        for task_id, starts in applied.items():
            self._job.queue.report(task_id, starts)
        for worker in recovery.lost:
            self._deferred.pop(worker, None)
            self._job.release(worker)
            # Out of the group but maybe alive (it hung, or went silent): end it, so that
            # the master replaces it (a no-op for one that is gone already).
            self._job.end_worker(worker)

    # ------------------------------------------------------------------ TrainingStrategy

    def ready_to_train(self) -> bool:
        return True  # the members form the group as they come

    def task_for_unwanted(self, worker_id: int) -> pb.Task:
        """A member the master scales away leaves at the group's next version: it gets
        no more work, and learns from the group when to go."""
        if worker_id in self.coordinator.members():
            self.coordinator.leave(worker_id)
        return pb.Task(type=pb.NONE, wait_seconds=0.5)

    def worker_reported(self, report: pb.ProgressReport) -> None:
        if report.HasField("settled"):
            s = report.settled
            self._job.journal.append(
                EventKind.GROUP_SETTLED, version=s.version, step=s.step,
                seconds=round(s.seconds, 6), cause=s.cause, worker=report.worker_id,
                completed_at=s.completed_at,
            )  # fmt: skip

    def worker_lost(self, worker: int) -> bool:
        """A worker process ended (under the master's lock). Returns whether its tasks
        may be released now; otherwise the survivors' recovery releases them."""
        members = self.coordinator.members()
        self.coordinator.dead(worker)
        if worker not in members:
            return True  # never admitted, or it left the group before it ended
        if not members - {worker} - set(self._deferred):
            return self._every_replica_lost(worker, members)
        self._deferred[worker] = time.monotonic()
        return False

    def _every_replica_lost(self, worker: int, members: set[int]) -> bool:
        """The last member ended: go back to the newest checkpoint, or fail."""
        job = self._job
        checkpoint = checkpoints.newest(JobDir(job.job_dir).checkpoints, job.queue.batch)
        if checkpoint is None:
            job.fail(
                f"worker {worker} ended and no other member of the allreduce group is alive: "
                "every replica of the model is lost, before the replicas' first checkpoint "
                "(every `checkpoint_steps` steps). Use a smaller checkpoint_steps, or "
                "strategy='ps'."
            )
            return True
        self._deferred.clear()
        for member in sorted(members | {worker}):
            job.release(member)  # (their evaluation and export tasks go back whole)
        held = [(e, s, sorted(starts)) for (e, s), starts in checkpoint.applied.held().items()]
        queued = job.queue.rewind(held, job.epoch)
        checkpoints.record_rollback(JobDir(job.job_dir).replicas, checkpoint.step, sorted(members))
        job.journal.append(
            EventKind.REQUEUE,
            reason="every replica lost",
            epoch=job.epoch,
            batches=queued,
            checkpoint_step=checkpoint.step,
        )
        self.coordinator.restart(str(checkpoint.path), checkpoint.step)
        job.work_changed()
        return False  # (its tasks are released already)

    def ps_lost(self, ps_id: int) -> None:
        pass  # an allreduce job has no PS

    def observe(self, final: bool = False) -> None:
        pass  # the members report with their progress

    def tick(self) -> None:
        """Release dead members no survivor has recovered from in `RELEASE_AFTER`
        seconds: their tasks must not be stuck for good."""
        now = time.monotonic()
        for worker, died in list(self._deferred.items()):
            if now - died > RELEASE_AFTER:
                log.warning("no recovery from worker %d's end; releasing its tasks", worker)
                del self._deferred[worker]
                self._job.release(worker)

    def reconcile_needed(self) -> bool:
        return False

    def reconcile(self, last_epoch: int) -> bool:
        return True  # the members' reports are the record (see the module docstring)

    def final_checkpoint(self) -> list[int] | None:
        return []  # the model lives in the replicas; the exported model is the result

    def replay(self, kind: str, data: dict) -> None:
        """The group's versions and decisions, and members that ended and were not
        recovered from yet. (A decision whose carrying out the old master did not journal
        is carried out when a survivor asks again: doing it twice changes nothing.)"""
        if kind == EventKind.GROUP:
            self.coordinator.replay(data)
            if data["reason"] == GroupChange.FAILURE:
                for worker in data["left"]:
                    self._deferred.pop(worker, None)
            elif data["reason"] == GroupChange.RESTORED:
                self._deferred.clear()
        elif (
            kind == EventKind.INSTANCE
            and data["role"] == Role.WORKER
            and data["kind"] in INSTANCE_ENDED
        ):
            members = self.coordinator.members()
            self.coordinator.dead(data["id"])
            if data["id"] in members:
                self._deferred[data["id"]] = time.monotonic()

    def resumed(self) -> None:
        pass  # the members find the new master themselves (their calls are retried)

    def status_fields(self) -> dict:
        try:
            group = self.coordinator.group()
        except KeyError:
            return {"group": {"version": 0, "members": []}}
        return {"group": {"version": group.version, "members": [w for w, _ in group.members]}}
