"""The states and names of a job and its parts: job states, phases, roles, strategies,
instance states and allreduce group changes (events.py has the journal's events).

Each is a `StrEnum`, so a member *is* its string: it goes into JSON, the journal and
gRPC messages as is, and compares equal to the plain string a reader got from the wire
(`JobState.FAILED == "failed"`). Nothing else in the package spells these words; the
sidebar takes the final states from the job API (`FINAL_STATES`).
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """Where a job is, as `Job.status()['state']`, the journal's `job_state` events and
    the sidebar say."""

    STARTING = "starting"  # submitted; its master is not serving yet (a pod being scheduled)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # by the user (Stop, `%elasticdl stop`, a signal to the master)
    LOST = "lost"  # its master is gone without recording an end state
    ENDED = "ended"  # a Kubernetes job seen only by its master pod, which has ended


# The states a master ends a job in (what its last `job_state` event says).
MASTER_END_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
# States after which nothing about the job changes any more.
FINAL_STATES = MASTER_END_STATES | {JobState.LOST, JobState.ENDED}


class Phase(StrEnum):
    """What a running job's master is doing, in this order; after a PS loses work at the
    very end (`finishing`), it goes back to `training` to redo it (see the master's
    transitions table)."""

    TRAINING = "training"
    EVALUATING = "evaluating"  # the final evaluation
    PREDICTING = "predicting"  # the trained model's outputs for the prediction data
    EXPORTING = "exporting"  # one worker writes the trained model
    FINISHING = "finishing"  # the final checkpoint, then `succeeded`
    DONE = "done"  # the job succeeded: the phase it ends in


class Role(StrEnum):
    """The kinds of process in a job."""

    MASTER = "master"
    WORKER = "worker"
    PS = "ps"


class Strategy(StrEnum):
    """How a job's workers share what they learn (`JobSpec.strategy`)."""

    PS = "ps"  # parameter servers hold the model; workers push gradients to them
    ALLREDUCE = "allreduce"  # every worker holds a replica; the group averages gradients


class InstanceState(StrEnum):
    """What happened to a worker or PS, the same words for every backend (the `kind` of
    an `instance` event)."""

    STARTED = "started"  # launched (process spawned, pod created)
    PENDING = "pending"  # waiting to be scheduled or started; `reason` says for what
    RUNNING = "running"  # confirmed running
    RETIRING = "retiring"  # a worker told to leave (scale down); it finishes its step first
    SUCCEEDED = "succeeded"  # exited with code 0
    FAILED = "failed"  # exited with a non-zero code
    KILLED = "killed"  # ended by a signal
    PREEMPTED = "preempted"  # taken away by the platform; not the instance's fault
    OOM = "oom"  # killed for exceeding its memory
    DELETED = "deleted"  # removed without exiting on its own


class GroupChange(StrEnum):
    """Why an allreduce group changed (the `reason` of a `group` event, the `cause` of a
    `group_settled` one)."""

    FORMED = "formed"  # the first members
    JOINED = "joined"  # a new member came in (scale up, or a replacement)
    LEFT = "left"  # a member left at a step the group agreed on (scale down)
    FAILURE = "failure"  # a member was lost; the survivors carried on without it
    RESTORED = "restored"  # every member was lost: the next group starts from a checkpoint


INSTANCE_ENDED = frozenset(
    {
        InstanceState.SUCCEEDED,
        InstanceState.FAILED,
        InstanceState.KILLED,
        InstanceState.PREEMPTED,
        InstanceState.OOM,
        InstanceState.DELETED,
    }
)
