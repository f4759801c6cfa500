"""What the test kubelet (kubelet.py) tells the API server, in the words a real kubelet
and scheduler use: the Node's status, why a pod does not fit, and a pod's status."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

HOST_IP = "127.0.0.1"
EVICTED = {"reason": "Evicted", "message": "The node was low on resource: memory."}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_status(capacity: dict[str, str]) -> dict:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    ready |= {"lastHeartbeatTime": now(), "lastTransitionTime": now()}
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [ready],
        "addresses": [{"type": "InternalIP", "address": HOST_IP}],
    }


# --- the scheduler ---------------------------------------------------------------------


def requests(pod: dict) -> dict[str, Decimal]:
    """The resources a pod asks for, counting the pod itself as one of `pods`."""
    total = {"pods": Decimal(1)}
    for container in pod["spec"]["containers"]:
        for resource, amount in ((container.get("resources") or {}).get("requests") or {}).items():
            total[resource] = total.get(resource, Decimal(0)) + parse_quantity(amount)
    return total


def unfit(pod: dict, labels: dict, capacity: dict, bound: Iterable[dict]) -> str | None:
    """Why `pod` does not fit on the node (its `labels`, `capacity`) beside the pods
    `bound` to it, as the scheduler says it; None if it fits."""
    if not (pod["spec"].get("nodeSelector") or {}).items() <= labels.items():
        return "0/1 nodes are available: 1 node(s) didn't match node selector."
    used: dict[str, Decimal] = {}
    for other in bound:
        for resource, amount in requests(other).items():
            used[resource] = used.get(resource, Decimal(0)) + amount
    short = [
        "Too many pods" if resource == "pods" else f"Insufficient {resource}"
        for resource, amount in sorted(requests(pod).items())
        if used.get(resource, 0) + amount > parse_quantity(capacity.get(resource, 0))
    ]
    return f"0/1 nodes are available: 1 {', 1 '.join(short)}." if short else None


def condition(kind: str, status: str, reason: str | None = None, message: str | None = None):
    # reason and message None: a strategic merge patch removes those reported before.
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now()}  # fmt: skip


def unschedulable(message: str) -> dict:
    return {"conditions": [condition("PodScheduled", "False", "Unschedulable", message)]}


def preempted() -> dict:
    """The condition the scheduler (1.26+) puts on a pod it is about to preempt."""
    message = "default-scheduler: preempting to accommodate a higher priority pod"
    return {"conditions": [condition("DisruptionTarget", "True", "PreemptionByScheduler", message)]}


# --- pods ------------------------------------------------------------------------------


def pod_status(pod: dict, phase: str, state: dict, ip: str, started: str, pid: int | None) -> dict:
    """The pod's `phase`, its conditions, and its (first) container in `state`:
    {"running": ...}, {"terminated": ...} or {"waiting": ...}."""
    container, ready = pod["spec"]["containers"][0], "running" in state
    not_ready = None if ready else "PodCompleted" if "terminated" in state else "ContainersNotReady"
    status = {
        "phase": phase,
        "hostIP": HOST_IP,
        "startTime": started or now(),
        "conditions": [
            condition("PodScheduled", "True"),
            condition("Initialized", "True"),
            condition("ContainersReady", str(ready), not_ready),
            condition("Ready", str(ready), not_ready),
        ],
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": f"test-kubelet://{container['image']}" if pid else "",
                "containerID": f"test-kubelet://{pid}" if pid else None,
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                # A strategic merge patch: a null removes the state reported before.
                "state": {"waiting": None, "running": None, "terminated": None, **state},
            }
        ],
    }
    if ip:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return status


def terminated(code: int, oom: bool, started: str, message: str) -> dict:
    reason = "OOMKilled" if oom else "Completed" if code == 0 else "Error"
    state = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now()}
    return {"terminated": state | ({"message": message} if message else {})}


def pull_failure(image: str, first: bool) -> dict:
    """The waiting state of a container whose image cannot be pulled (first, then later)."""
    if first:
        message = (
            "rpc error: code = Unknown desc = Error response from daemon: pull access denied "
            f"for {image}, repository does not exist or may require 'docker login'"
        )
        return {"reason": "ErrImagePull", "message": message}
    return {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}
