"""Where the scheduler may put a job's pods, set by what it leaves free on each node.

The node-loss tests need to know which node a role runs on without changing the job
(a pod template applies to every role alike). The scheduler's own rule does it: a pod
goes only where its CPU request fits. `leave_free` pins a ballast pod to a node that
requests all of its allocatable CPU but `free_m`; then a master and PS that ask more than
an extra node has left land on the node with room, and workers that ask less where they fit.
"""

from __future__ import annotations

import time

from tests.kubernetes.node import job_image_name


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def requested_m(core, node: str) -> int:
    """The CPU the pods bound to `node` request, those that have not ended."""
    bound = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    total = 0
    for pod in bound:
        if pod.status.phase in ("Succeeded", "Failed"):
            continue
        for container in pod.spec.containers:
            requests = (container.resources and container.resources.requests) or {}
            total += _millicores(requests.get("cpu", "0"))
    return total


def _settled(core, node: str, timeout: float = 90) -> None:
    """Wait until no pod on `node` is being deleted (an earlier test's namespace going)."""
    deadline = time.monotonic() + timeout
    while True:
        bound = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        going = [p.metadata.name for p in bound if p.metadata.deletion_timestamp]
        if not going:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pods on {node} still being deleted after {timeout} s: {going}")
        time.sleep(0.5)


def leave_free(core, namespace: str, node: str, free_m: int) -> int:
    """Pin a ballast pod to `node` so that `free_m` millicores of its allocatable CPU
    stay unrequested, once the pods being deleted there are gone; returns what the
    ballast asks for."""
    _settled(core, node)
    allocatable = _millicores(core.read_node(node).status.allocatable["cpu"])
    ballast = allocatable - requested_m(core, node) - free_m
    if ballast < 0:
        raise AssertionError(f"{node} has less than {free_m}m free already")
    if ballast:
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": f"ballast-{node}"},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "ballast",
                            "image": job_image_name(),
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": {"cpu": f"{ballast}m"}},
                        }
                    ],
                },
            },
        )
    return ballast


def clear(core, namespace: str, timeout: float = 60) -> None:
    """Delete the ballast pods of `namespace` at once and wait until they are gone, so
    the next test finds the nodes' room (a namespace's deletion takes its pods later)."""
    mine = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    ballast = [name for name in mine if name.startswith("ballast-")]
    for name in ballast:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    deadline = time.monotonic() + timeout
    while {p.metadata.name for p in core.list_namespaced_pod(namespace).items} & set(ballast):
        if time.monotonic() > deadline:
            raise AssertionError(f"ballast pods still there after {timeout} s")
        time.sleep(0.2)
