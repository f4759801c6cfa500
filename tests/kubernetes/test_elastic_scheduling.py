"""Elastic scheduling on the real node: a job with a worker range shares the node with
pods of higher priority. The node is shaped with pods that request CPU (node_cpu.py), so
the real scheduler decides: what does not fit stays pending with its own reason, and a
pod of higher priority preempts the lowest first. (The same on two jobs and on a
service, measured: bench/elastic_scheduling.py.)"""

from __future__ import annotations

import pytest

import elasticdl_nb as edl
from elasticdl_nb.sdk.view import JobView
from tests.integration.faults import wait_for
from tests.integration.models import DIGITS, custom_model, digits_split, paced_loss
from tests.kubernetes.job_pods import SMALL, k8s_options, pods
from tests.kubernetes.node_cpu import cpu_pod, free_millicores, millicores

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

WORKER_CPU = 300  # millicores each worker requests


def settled(core, node_name: str) -> str:
    """'' once no pod on the node is being deleted (their CPU is then free for good)."""
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
    going = [p.metadata.name for p in on_node.items if p.metadata.deletion_timestamp]
    return f"{', '.join(going)} being deleted" if going else ""


def worker_pods(core, namespace: str) -> dict[str, list]:
    """The job's worker pods that are not being deleted, by phase."""
    by_phase: dict[str, list] = {}
    for p in pods(core, namespace, "worker").values():
        if not p.metadata.deletion_timestamp:
            by_phase.setdefault(p.status.phase, []).append(p)
    return by_phase


def elastic(pod) -> bool:
    return pod.spec.priority_class_name == "elasticdl-nb-elastic"


def view_of(job) -> dict:
    return JobView.for_job(job).catch_up(job).workers_summary()


def test_a_range_fills_the_node_yields_to_priority_and_grows_back(
    job_home, job_namespace, real_node, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    wait_for(lambda: not settled(core, real_node.name), 120, "a settled node")
    # Room for the master, the PS and three and a half workers; the rest is taken by a
    # pod at the master's priority, which no worker can preempt.
    small = millicores(SMALL.split(",")[0].split("=")[1])
    room = 2 * small + WORKER_CPU * 7 // 2
    filler = free_millicores(core, real_node.name) - room
    assert filler > 0, f"the node has less than {room}m of CPU free"
    core.create_namespaced_pod(job_namespace, cpu_pod("filler", filler, "elasticdl-nb-high"))
    print(f"filler takes {filler}m: room for 3 workers of {WORKER_CPU}m")

    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": paced_loss},
        data=(x, y),
        workers="2:4",
        epochs=200,  # stopped at the end
        minibatch_size=32,
        **{**k8s_options(real_cluster, job_namespace, tmp_path),
           "worker_resources": f"cpu={WORKER_CPU}m,memory=1Gi"},
    )  # fmt: skip

    # Three fit: they run (two at the base priority, one elastic); the fourth, elastic,
    # is pending with the scheduler's reason, in the status and in the client's view.
    def three_and_one() -> bool:
        phases = worker_pods(core, job_namespace)
        return len(phases.get("Running", [])) == 3 and len(phases.get("Pending", [])) == 1

    wait_for(three_and_one, 180, "3 running workers and 1 pending")
    phases = worker_pods(core, job_namespace)
    assert [elastic(p) for p in phases["Pending"]] == [True]
    assert sorted(elastic(p) for p in phases["Running"]) == [False, False, True]
    # The master creates workers before the client sees it ready (its readiness probe runs
    # every 2 s and the kubelet reports it some time later): until then status()
    # says "starting", without the master's fields.
    pending = wait_for(lambda: job.status().get("pending_workers"), 60, "a pending worker")
    assert "Insufficient cpu" in pending[0]["reason"], pending
    wait_for(lambda: job.status().get("running_workers") == 3, 60, "status: 3 running")
    assert job.status()["workers"] == 4  # (running and pending)
    summary = wait_for(lambda: (s := view_of(job))["pending"] == 1 and s, 30, "the view")
    assert "Insufficient cpu" in summary["pending_reason"] and summary["min"] == 2
    wait_for(lambda: job.status()["step"] > 0, 180, "training with 3 of 4")

    # A pod of higher priority that needs a worker's room: the elastic one goes.
    core.create_namespaced_pod(job_namespace, cpu_pod("service", WORKER_CPU, "elasticdl-nb-high"))

    def preempted() -> list:
        return [
            e.data
            for e in job.events(follow=False)
            if e.kind == "instance" and e.data["kind"] == "preempted"
        ]

    (victim,) = wait_for(preempted, 60, "a preempted worker")
    print(f"preempted: worker {victim['id']} ({victim.get('reason')})")
    assert victim.get("elastic") is True, victim
    base = [p for p in worker_pods(core, job_namespace).get("Running", []) if not elastic(p)]
    assert len(base) == 2  # the first MIN ran on
    wait_for(lambda: core.read_namespaced_pod("service", job_namespace).status.phase == "Running",
             60, "the service pod running")  # fmt: skip

    # Room again: the job grows back to 4.
    for name in ("service", "filler"):
        core.delete_namespaced_pod(name, job_namespace, grace_period_seconds=0)
    wait_for(lambda: len(worker_pods(core, job_namespace).get("Running", [])) == 4, 180, "4")
    wait_for(lambda: view_of(job)["live"] == 4 and view_of(job)["pending"] == 0, 60, "view 4/4")

    # A new range: the elastic workers retire first.
    scaled = job.scale("1:2")
    assert (scaled["workers_to"], scaled["min_workers"]) == (2, 1)
    wait_for(lambda: len(worker_pods(core, job_namespace).get("Running", [])) == 2, 120, "2")
    assert not any(elastic(p) for p in worker_pods(core, job_namespace)["Running"])
    assert job.stop()["state"] == "stopped"
