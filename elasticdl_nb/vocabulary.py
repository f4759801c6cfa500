"""The words every part of a job speaks: job states, phases, roles, strategies, instance
states and the kinds of journal events.

Each is a `StrEnum`, so a member *is* its string: it goes into JSON, the journal and
gRPC messages as is, and compares equal to the plain string a reader got from the wire
(`JobState.FAILED == "failed"`). Nothing else in the package spells these words; the
README's event table is written from `EventKind` (a test fails when the two differ) and
the sidebar takes the final states from the job API (`FINAL_STATES`).

This module sits below everything (it imports nothing of ours), so the runtime, the
backends, the SDK and every front end can share it.
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


class EventKind(StrEnum):
    """The kinds of event in a job's journal; each member's `fields` say what its data
    holds (the README's event table is these, in this order)."""

    fields: str

    def __new__(cls, value: str, fields: str) -> EventKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.fields = fields
        return member

    JOB_STATE = (
        "job_state",
        "`state` (running, succeeded, failed, stopped), `reason`, and the progress fields; "
        "`recorded_by`: `supervisor` when a local job's master could not record the end",
    )
    PROGRESS = (
        "progress",
        "`epoch`, `epochs`, `step`, `records_done`, `records_per_epoch`, "
        '`records_per_second`, `goodput` (training over wanted worker time: see "Goodput"), '
        "`training_s`, `recovering_s` (worker-seconds) (after each training task)",
    )
    LOSS = (
        "loss",
        "`worker`, `points`: `[[n, loss], ...]` (n counts every reported minibatch, "
        "redone ones too); `learning_rates`: `[[n, rate], ...]`, the optimizer's learning "
        "rate at the update that took the minibatch (PS: the newest update when its push "
        "was taken; allreduce: the step's)",
    )
    WORKER_TIME = (
        "worker_time",
        "`worker`, `task`, `minibatches`, `task_s`, `compute_s` (in the train step), "
        "`wait_s` (blocked on PS replies, or in the allreduce); `stale` (with `grads_to_wait`: "
        "minibatches a PS refused as computed on an older version, computed again): where a "
        "worker's time on one training task went",
    )
    STRAGGLER = (
        "straggler",
        "`worker`, `step_s` (its seconds per minibatch), `median_s` (the other workers' "
        "median), `ratio`, `lagging_s`: a worker's step time stayed above twice the others' "
        'median (see "Stragglers")',
    )
    STRAGGLER_CLEARED = (
        "straggler_cleared",
        "`worker`, `reason` (caught up, ended), and when it caught up `step_s`, `median_s`, "
        "`ratio`: a straggler is no longer one",
    )
    PHASE = "phase", "`phase` (training, evaluating, exporting, finishing, done), `previous`"
    EPOCH = "epoch", "`epoch`, `tasks`"
    EVALUATION_STARTED = (
        "evaluation_started",
        "`round`, `step`, `tasks`, `final`; `epoch`: the epoch whose end it judges (the "
        "callbacks' `on_epoch_end` waits for it)",
    )
    EVALUATION = "evaluation", "`round`, `step`, `metrics` (name → value), `final`"
    INSTANCE = (
        "instance",
        "`role`, `id`, `kind` (started, pending, running, retiring, succeeded, failed, "
        "killed, preempted, oom, deleted), `pid`, `exit_code`, `signal`, `reason`, `expected`",
    )
    PENDING_TOO_LONG = (
        "pending_too_long",
        "`role`, `id`, `seconds`, `reason`: an instance waited longer than `pending_timeout` "
        "to start (a PS: the job fails; a worker: it is given up)",
    )
    MEMORY_RAISED = (
        "memory_raised",
        "`role`, `id`, `memory` ('OLD -> NEW'): after an OOM kill, the role's next "
        "instances get more memory",
    )
    SCALE = "scale", "`workers_from`, `workers_to`, `reason`"
    RELAUNCH = (
        "relaunch",
        "`role`, `id`, `replaces`, `reason`, `worker_crashes`, `ps_crashes` (the crash "
        "budget spent so far)",
    )
    RELAUNCH_REFUSED = (
        "relaunch_refused",
        "`role`, `id`, `reason` (the budget is spent), `worker_crashes`, `ps_crashes`",
    )
    REQUEUE = "requeue", "`epoch`, `batches`, and `worker`/`task`/`kind` or `source`/`reason`"
    PS_RESTORED = (
        "ps_restored",
        "`ps`, `restored_version`, `newest_seen_version`, `updates_rolled_back`",
    )
    EXPORT = (
        "export",
        '`path` ("" with export_format saved_model), `worker`; `saved_model`: the '
        "SavedModel's folder (export_format saved_model or both); `tables`: true when the "
        "tables were too large for a Keras file and `path` holds their (id, vector) files",
    )
    CHECKPOINT = "checkpoint", "`versions`, `final`"
    LEARNING_RATE = (
        "learning_rate",
        "`rate`, `set` (the how-manieth setting), `by` (the callback), `epoch`, `step`: a "
        "callback set the learning rate of every update from now on (PS: of the pushes of "
        "tasks handed out from now on; allreduce: from the first step a member holds it)",
    )
    CALLBACK = (
        "callback",
        "`hook` (e.g. `on_epoch_end`), `args`, `logs`: the master called the model's "
        "callbacks (all but `on_train_batch_end`); a master that takes the job over calls "
        "them again to rebuild their state",
    )
    TRAINING_STOPPED = (
        "training_stopped",
        "`reason` (which callback, when), `epoch`, `step`, `dropped` (training tasks not "
        "started): a callback stopped training; the job evaluates, exports and succeeds",
    )
    TABLES = (
        "tables",
        "(PS embedding tables, when they changed; polled every few seconds and before the "
        "job ends) `tables`: per table the sums over the PS of `rows` held, `bytes`, rows "
        "`created` and `evicted`, gradients `refused` by admission; `ps_rows`: rows held "
        "per PS",
    )
    GROUP = (
        "group",
        "(allreduce) `version`, `members`, `addresses`, `joined`, `left`, `reason` (formed, "
        "joined, left, failure, restored); after a failure `step`, `agreed_s`, `causes` and "
        "the decision (`failed`, `source`, `behind`, `joiners`); when every member was lost "
        "(`restored`) and when the next group forms, `restore` (the replicas' checkpoint) "
        "and `step`",
    )
    MASTER_RESTARTED = (
        "master_restarted",
        "`incarnation`, `pid`, `replayed` (events read back), `rebuild_s`, `down_s` (since "
        "the last event of the master that died), `adopted` (instances still there): a new "
        "master took over the job from one that died",
    )
    QUEUE = (
        "queue",
        "`op` (a change to the task queue: `add_epoch`, `next_for`, `report`, `finish`, "
        "`release_worker`, `requeue_batches`, `settle`, `add_evaluation`, `add_export`), its "
        "arguments, `task` (the id handed out), `worker`/`seq` (the request): the master's "
        "record of its tasks, which a new master replays",
    )
    EVALUATION_TASK = (
        "evaluation_task",
        "`round`, `worker`, `states` (metric name → its variables as lists): one evaluation "
        "task's metric states, summed into its round",
    )
    GROUP_SETTLED = (
        "group_settled",
        "(allreduce) `version`, `step`, `seconds` (from the change to the group's next "
        "completed step), `cause`, `completed_at`, `worker`",
    )


def event_table() -> str:
    """The README's table of event kinds, in Markdown."""
    rows = ["| kind | data |", "|---|---|"]
    rows += [f"| `{kind}` | {kind.fields} |" for kind in EventKind]
    return "\n".join(rows)
