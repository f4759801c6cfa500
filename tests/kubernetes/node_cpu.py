"""The node's CPU as the scheduler counts it (requests against allocatable), and pods that
take a chosen share of it at a chosen priority: what the preemption tests and the
elastic-scheduling benchmark shape the node with."""

from __future__ import annotations

from typing import Any


def millicores(quantity: str) -> int:
    """'250m' -> 250, '2' -> 2000, '1.5' -> 1500."""
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def requested_millicores(pod) -> int:
    """The CPU a pod (a kubernetes client V1Pod) holds on its node: its containers'
    requests, while it has not ended."""
    if pod.status.phase in ("Succeeded", "Failed"):
        return 0
    return sum(
        millicores(((c.resources and c.resources.requests) or {}).get("cpu", "0"))
        for c in pod.spec.containers
    )


def allocatable_millicores(core, node_name: str) -> int:
    return millicores(core.read_node(node_name).status.allocatable["cpu"])


def free_millicores(core, node_name: str) -> int:
    """Allocatable CPU that no pod placed on the node requests."""
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
    used = sum(requested_millicores(p) for p in on_node.items)
    return allocatable_millicores(core, node_name) - used


def cpu_pod(name: str, cpu_millicores: int, priority_class: str, **labels: str) -> dict[str, Any]:
    """A pod that requests `cpu_millicores` at `priority_class` and sleeps (it takes room
    from the scheduler, not CPU from the machine); deleted at once when asked."""
    from tests.kubernetes.node import job_image_name

    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": job_image_name(),
                    "command": ["sleep", "36000"],
                    "resources": {"requests": {"cpu": f"{cpu_millicores}m", "memory": "16Mi"}},
                }
            ],
        },
    }
