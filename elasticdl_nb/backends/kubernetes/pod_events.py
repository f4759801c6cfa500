"""A pod, as the API server reports it, turned into the one normalized `InstanceEvent`.

The master's policy (runtime/master/instances.py) knows nothing of pods: it hears that a
worker is pending (and why), running, succeeded, failed with an exit code, was killed by
a signal, ran out of memory, was preempted or evicted, or was deleted. This module reads
those facts out of a pod's status; it is a pure function, so every case is a unit test.

Where the facts live:
- scheduling: `status.conditions[type=PodScheduled]` with reason `Unschedulable` and the
  scheduler's message ("0/3 nodes are available: 3 Insufficient memory");
- image trouble: the container's `state.waiting.reason` (ErrImagePull, ImagePullBackOff,
  InvalidImageName, CreateContainerConfigError);
- the end: the container's `state.terminated` (exitCode, reason OOMKilled/Error/Completed);
- taken away: `status.reason` Evicted/Preempting (older servers), or a
  `DisruptionTarget` condition (1.26+: PreemptionByScheduler, EvictionByEvictionAPI,
  DeletionByTaintManager, TerminationByKubelet).
- lost with its node: a node whose kubelet stops reporting (a VM gone, a partition) has
  its pods marked not Ready by the node controller, which leaves `ContainersReady` as
  the kubelet last said (True: only a kubelet makes Ready False with it True), and then
  deleted by the taint manager after their `unreachable` toleration. Such a pod keeps a
  deletion timestamp and a running container for ever: no kubelet is there to end it.
  Deleted and not Ready that way, it is lost (preempted: not its fault), not terminating.
"""

from __future__ import annotations

import signal
from typing import Any

from elasticdl_nb.backends.kubernetes.manifests import LABEL_INDEX, LABEL_ROLE
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.vocabulary import InstanceState

_IMAGE_TROUBLE = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
}
NODE_LOST = "NodeLost: its node stopped answering, and the node controller evicted it"
_TAKEN_AWAY = {"Evicted", "Preempting", "Preempted", "NodeLost", "Shutdown", "Terminated"}


def instance_event(pod: dict[str, Any], deleted: bool = False) -> InstanceEvent | None:
    """The event a pod's current state means, or None for a pod that is not a worker or
    PS of ours. `deleted`: the watch reported the pod gone."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    role = labels.get(LABEL_ROLE)
    if role not in ("worker", "ps") or LABEL_INDEX not in labels:
        return None
    index = int(labels[LABEL_INDEX])
    status = pod.get("status") or {}

    def event(kind: str, **fields: Any) -> InstanceEvent:
        return InstanceEvent(role, index, kind, **fields)

    container = _first_container_status(status)
    terminated = (container.get("state") or {}).get("terminated")
    taken = _taken_away(status)
    if terminated:
        code = terminated.get("exitCode")
        why = terminated.get("reason") or ""
        message = terminated.get("message") or ""
        if why == "OOMKilled":
            return event(
                InstanceState.OOM, exit_code=code, reason="OOMKilled: over its memory limit"
            )
        if taken:
            return event(InstanceState.PREEMPTED, exit_code=code, reason=taken)
        if deleted or meta.get("deletionTimestamp"):
            # Someone deleted the pod; the kubelet's SIGTERM is how it ended, not why.
            return event(
                InstanceState.DELETED, exit_code=code, reason=f"pod deleted (exit code {code})"
            )
        if code == 0:
            return event(InstanceState.SUCCEEDED, exit_code=0, reason="completed")
        if code is not None and code > 128 and _signal_name(code - 128):
            name = _signal_name(code - 128)
            return event(
                InstanceState.KILLED, exit_code=code, signal=name, reason=f"killed by {name}"
            )
        return event(
            InstanceState.FAILED,
            exit_code=code,
            reason=message or why or f"exited with code {code}",
        )
    if taken:
        return event(InstanceState.PREEMPTED, reason=taken)
    if meta.get("deletionTimestamp") and _node_lost(status):
        return event(InstanceState.PREEMPTED, reason=NODE_LOST)
    phase = status.get("phase")
    if deleted or (meta.get("deletionTimestamp") and phase in ("Failed", "Succeeded")):
        # (A real kubelet may end a deleted pod's phase before its container's state.)
        return event(InstanceState.DELETED, reason="pod deleted")
    if phase == "Running":
        return event(InstanceState.RUNNING)
    if phase == "Failed":  # failed before a container ran (admission, node trouble)
        return event(
            InstanceState.FAILED, reason=status.get("message") or status.get("reason") or "failed"
        )
    if phase == "Succeeded":
        return event(InstanceState.SUCCEEDED, exit_code=0, reason="completed")
    why = waiting_reason(pod)
    if why:
        return event(InstanceState.PENDING, reason=why)
    # Created, on its way (scheduled, pulling, creating): nothing to say.
    return event(InstanceState.STARTED)


def waiting_reason(pod: dict[str, Any]) -> str:
    """Why a pod that has not started is stuck ('' when it is simply on its way): the
    scheduler cannot place it, or its image cannot be pulled."""
    status = pod.get("status") or {}
    waiting = (_first_container_status(status).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in _IMAGE_TROUBLE:
        return f"{waiting['reason']}: {waiting.get('message', '')}".strip()
    unscheduled = _condition(status, "PodScheduled")
    if unscheduled and unscheduled.get("status") == "False":
        message = unscheduled.get("message") or unscheduled.get("reason") or "not scheduled"
        return f"unschedulable: {message}"
    return ""


def _first_container_status(status: dict[str, Any]) -> dict[str, Any]:
    statuses = status.get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _taken_away(status: dict[str, Any]) -> str:
    """Why the platform took the pod away ('' if it did not): eviction, preemption."""
    disruption = _condition(status, "DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        return f"{disruption.get('reason', 'disrupted')}: {disruption.get('message', '')}".strip()
    if status.get("reason") in _TAKEN_AWAY:
        return f"{status['reason']}: {status.get('message', '')}".strip().rstrip(":")
    return ""


def _node_lost(status: dict[str, Any]) -> bool:
    """Marked not Ready by the node controller, not by its kubelet (module docstring)."""
    ready, containers = _condition(status, "Ready"), _condition(status, "ContainersReady")
    return bool(
        ready and ready.get("status") == "False"
        and containers and containers.get("status") == "True"
        and status.get("phase") not in ("Failed", "Succeeded")
    )  # fmt: skip


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None
