"""Losing a node under a job, as the node-loss tests (test_several_nodes.py) and the
node-loss benchmark (bench/node_loss.py) do it: the nodes laid out with ballast so that
a role lands on the node to be lost (`LAYOUTS`), a paced PS job of three workers that
records its ledger and tolerates a lost node for 5 s, the node lost at a step, and the
cluster put back for the next loss."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import elasticdl_nb as edl
from tests.integration.faults import wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split
from tests.kubernetes.job_pods import close_forward, k8s_options, pods
from tests.kubernetes.placement import clear, leave_free
from tests.kubernetes.test_kubernetes_jobs import _paced_loss

MASTER, PS = "cpu=400m,memory=1Gi", "cpu=350m,memory=1Gi"  # workers: 100m (job_pods.SMALL)

# The jobs tolerate an unreachable or not-ready node for 5 s instead of the API server's
# default 300 s: a user's pod template, as a user with these needs would write it.
TOLERATIONS = """
spec:
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
"""
EPOCHS = 20


# Which role is alone (or the only kind) on the node to lose: the free millicores left on
# the first node and on the victim, and the job's requests. The roles land where the
# scheduler's own fit rule puts them (placement.leave_free).
LAYOUTS = {
    # The master, the PS and one worker on the first node (900m), two workers on the
    # victim (200m): the room there is exactly the three workers' (100m each).
    "worker": (900, 200, {}),
    # The master (400m) and the workers (3 x 100m) on the first node, the PS (350m) alone
    # on the victim (the scheduler places it before the workers: the higher priority).
    "ps": (700, 350, {}),
    # The master (700m here) alone on the victim; the PS and the workers (650m) on the
    # first node, where the master does not fit.
    "master": (650, 700, {"master": "cpu=700m,memory=1Gi"}),
}


def placed(core, namespace: str) -> dict[str, tuple[str, int, str]]:
    """The job's pods now: name -> (role, index, node)."""
    return {
        name: (
            p.metadata.labels["elasticdl-nb/role"],
            int(p.metadata.labels.get("elasticdl-nb/index", 0)),
            p.spec.node_name,
        )
        for name, p in pods(core, namespace).items()
        if not p.metadata.deletion_timestamp
    }


def layout(core, namespace: str, real_session, role: str):
    """The nodes laid out for `role` (LAYOUTS): the first node and an extra node not
    lost yet (returned: the victim) with room as said there, the other extra nodes full."""
    first_free_m, victim_free_m, _ = LAYOUTS[role]
    live = [n for n in real_session.extra if not n.lost]
    victim, others = live[0], live[1:]
    leave_free(core, namespace, real_session.node.name, first_free_m)
    leave_free(core, namespace, victim.name, victim_free_m)
    for node in others:
        leave_free(core, namespace, node.name, 0)
    return victim


def train(real_cluster, namespace: str, tmp_path, role: str):
    """A PS job of three workers that records its PS ledger, with the requests of
    `role`'s layout; and its records."""
    requests = {"master": MASTER, "ps": PS, **LAYOUTS[role][2]}
    (x, y), _ = digits_split()
    template = tmp_path / "tolerations.yaml"
    template.write_text(TOLERATIONS)
    options = k8s_options(real_cluster, namespace, tmp_path)
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=3,
        epochs=EPOCHS,
        minibatch_size=32,
        checkpoint_steps=40,
        record_ledger=True,
        pod_template=str(template),
        **{**options, "master_resources": requests["master"], "ps_resources": requests["ps"]},
    )
    return job, len(x)


def lose_at_step(job, core, namespace: str, real_session, victim, step: int) -> tuple:
    """At `step`: where the job's pods are, checked and printed; then room made on the
    first node for what the victim ran, and the victim lost. Returns (where the pods
    were, the roles that were on the victim, when it was lost: wall clock)."""
    wait_for_step(job, step, timeout=300)
    where = placed(core, namespace)
    print(f"placed: {where}")
    on_victim = sorted(r for r, _, n in where.values() if n == victim.name)
    make_room_on_the_first_node(core, namespace, real_session)
    victim.lose()
    print(f"lost {victim.name} with {on_victim} at step {step}")
    return where, on_victim, time.time()


def make_room_on_the_first_node(core, namespace: str, real_session) -> None:
    ballast = f"ballast-{real_session.node.name}"
    core.delete_namespaced_pod(ballast, namespace, grace_period_seconds=0)


def node_lost_events(events, role: str) -> list:
    return [
        e for e in events
        if e.kind == "instance" and e.data["role"] == role
        and "NodeLost" in e.data.get("reason", "")
    ]  # fmt: skip


def close(job, core, namespace: str, real_session, victim) -> None:
    """The job's port-forward, the test's ballast and what is left of the lost node
    (before the next test lays the nodes out), and a fresh controller manager: in
    1.20.2 a node lost earlier can leave its taint manager's queue stuck, so that the
    next lost node is never tainted NoExecute (kubernetes#94183; seen here: the third
    loss of a module waited 10 min)."""
    close_forward(job)
    clear(core, namespace)
    if victim.lost:
        undone = real_session.remove_node(victim)
        real_session.cluster.restart_controller_manager()
        assert not undone, undone


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a container's processes, from the host)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
