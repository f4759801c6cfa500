"""Pod states, as a Kubernetes API server reports them, and the instance events they mean."""

from __future__ import annotations

import pytest

from elasticdl_nb.backends.kubernetes.manifests import labels
from elasticdl_nb.backends.kubernetes.pod_events import instance_event

NO_ROOM = "0/3 nodes are available: 3 Insufficient memory."
OVER_LIMIT = "OOMKilled: over its memory limit"


def pod(status: dict | None = None, role: str = "worker", index: int = 2) -> dict:
    return {"metadata": {"name": "x", "labels": labels("job", role, index)}, "status": status}


def terminated(code: int, reason: str = "Error", message: str = "") -> dict:
    state = {"terminated": {"exitCode": code, "reason": reason, "message": message}}
    return {"phase": "Failed", "containerStatuses": [{"name": "worker", "state": state}]}


@pytest.mark.parametrize(
    "status, deleted, expected",
    [
        (None, False, ("started", None, None, "")),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": NO_ROOM,
                    }
                ],
            },
            False,
            ("pending", None, None, f"unschedulable: {NO_ROOM}"),
        ),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "nope:1"',
                            }
                        }
                    }
                ],
            },
            False,
            ("pending", None, None, 'ImagePullBackOff: Back-off pulling image "nope:1"'),
        ),
        ({"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}, False,
         ("running", None, None, "")),
        (terminated(0, "Completed"), False, ("succeeded", 0, None, "completed")),
        (terminated(3, "Error", "Traceback ..."), False, ("failed", 3, None, "Traceback ...")),
        (terminated(137, "Error"), False, ("killed", 137, "SIGKILL", "killed by SIGKILL")),
        (terminated(137, "OOMKilled"), False, ("oom", 137, None, OVER_LIMIT)),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."},
            False,
            ("preempted", None, None, "Evicted: The node was low on memory."),
        ),
        (
            {
                **terminated(143, "Error"),
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                        "message": "high-priority pod needed room",
                    }
                ],
            },
            True,
            ("preempted", 143, None, "PreemptionByScheduler: high-priority pod needed room"),
        ),
        ({"phase": "Running"}, True, ("deleted", None, None, "pod deleted")),
        # Deleted by someone: the kubelet's SIGTERM is how it ended, not why.
        (terminated(143, "Error"), True, ("deleted", 143, None, "pod deleted (exit code 143)")),
    ],
    ids=[
        "created", "unschedulable", "image-pull", "running", "succeeded", "failed",
        "sigkill", "oom", "evicted", "preempted", "deleted", "deleted-after-sigterm",
    ],
)  # fmt: skip
def test_pod_states_become_normalized_instance_events(status, deleted, expected):
    event = instance_event(pod(status), deleted=deleted)
    assert (event.role, event.instance_id) == ("worker", 2)
    assert (event.kind, event.exit_code, event.signal, event.reason) == expected


def test_a_deleted_pod_whose_phase_ended_before_its_container_state_was_deleted():
    """Seen from a real kubelet: the PS pod deleted, its phase Failed, its container's
    state not terminated yet. Deleted, not failed (a failure counts against the budget)."""
    deleting = pod({"phase": "Failed", "containerStatuses": [{"state": {"running": {}}}]}, "ps", 0)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T14:42:55Z"
    event = instance_event(deleting)
    assert (event.role, event.kind, event.reason) == ("ps", "deleted", "pod deleted")
    deleting["status"]["phase"] = "Running"  # still stopping: nothing to say yet
    assert instance_event(deleting).kind == "running"


def test_pods_that_are_not_workers_or_ps_are_ignored():
    assert instance_event(pod({"phase": "Running"}, role="master")) is None
    assert instance_event({"metadata": {"labels": {}}, "status": {}}) is None


def _conditions(ready: str, containers_ready: str) -> list[dict]:
    return [
        {"type": "Ready", "status": ready},
        {"type": "ContainersReady", "status": containers_ready},
    ]


def test_a_pod_evicted_from_a_lost_node_is_lost_not_terminating_for_ever():
    """As a 1.20.2 cluster left a pod whose node was hard-stopped (probed with
    extra_node.py): Ready False by the node controller, ContainersReady True and the
    container running as the kubelet last said, then a deletion timestamp from the taint
    manager, and nothing more for ever."""
    running = {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}
    lost = pod({**running, "conditions": _conditions("False", "True")}, "ps", 0)
    # Not Ready while its node is unreachable, within its toleration: still its own.
    assert instance_event(lost).kind == "running"
    lost["metadata"]["deletionTimestamp"] = "2026-12-05T23:00:16Z"
    event = instance_event(lost)
    assert (event.role, event.kind) == ("ps", "preempted")
    assert event.reason.startswith("NodeLost: its node stopped answering")
    # A pod deleted on a healthy node: its kubelet ends the containers, and says so.
    stopping = pod({**running, "conditions": _conditions("False", "False")})
    stopping["metadata"]["deletionTimestamp"] = "2026-12-05T23:00:16Z"
    assert instance_event(stopping).kind == "running"  # nothing to say until it ends
