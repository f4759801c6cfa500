"""Several real nodes on one machine (extra_node.py, conftest's `four_nodes`), and what a
job survives when one of them is lost.

The nodes first: the scheduler spreads a Deployment over them, and a pod on every node
reaches the pods of the others and a Service (kube-proxy on the first node serves all:
the nodes share the host's network namespace). Then a node lost the way a VM dies (its
kubelet, runtime and containers SIGKILLed, the API server told nothing), at a random
step, with a job's workers, its PS, or its master on it: the job goes on and every record
is applied exactly once (the PS ledger). And a node cut off with the master running on it
(frozen): the master's lease fences it off, and its successor takes the job over.

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_several_nodes.py
"""

from __future__ import annotations

import json
import signal
import textwrap
import time
from pathlib import Path

import pytest

from elasticdl_nb.backends.kubernetes import master_lease
from elasticdl_nb.runtime.master.journal import read_journal_file
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.kubernetes import node_loss
from tests.kubernetes.test_kubernetes_jobs import STEPS_PER_EPOCH
from tests.kubernetes.test_real_node import pod_manifest, wait_phase

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

PORT = 8080


def _echo_deployment(name: str, replicas: int) -> dict:
    """`replicas` pods that answer HTTP with their own name, and are Ready when they do."""
    pod = pod_manifest(
        name,
        ["python3", "-c", _ECHO_SERVER, str(PORT)],
        container={"readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1}},
    )
    pod["spec"]["restartPolicy"] = "Always"
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod,
        },
    }


_ECHO_SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = os.environ["HOSTNAME"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Echo).serve_forever()
    """
)

# A pod that GETs every URL given and prints {url: answer or error} as JSON.
_FETCH = textwrap.dedent(
    """
    import json, sys, urllib.request
    out = {}
    for url in sys.argv[1:]:
        try:
            out[url] = urllib.request.urlopen(url, timeout=5).read().decode()
        except Exception as exc:
            out[url] = f"error: {exc}"
    print(json.dumps(out))
    """
)


def test_the_scheduler_spreads_pods_over_four_nodes_which_reach_each_other_and_services(
    four_nodes, real_admin, real_namespace
):
    from kubernetes import client

    core, apps = client.CoreV1Api(real_admin), client.AppsV1Api(real_admin)
    names = [n.name for n in four_nodes]
    ready = {
        n.metadata.name
        for n in core.list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    }
    assert ready == set(names)

    apps.create_namespaced_deployment(real_namespace, _echo_deployment("echo", len(names)))
    core.create_namespaced_service(
        real_namespace,
        {
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": PORT}]},
        },
    )

    def all_ready():
        pods = core.list_namespaced_pod(real_namespace, label_selector="app=echo").items
        done = [
            p for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
        ]  # fmt: skip
        return done if len(done) == len(names) else None

    echoes = wait_for(all_ready, 120, "an echo pod Ready per node")
    by_node = {p.spec.node_name: p for p in echoes}
    assert set(by_node) == set(names), "the scheduler put two replicas on one node"

    service_ip = core.read_namespaced_service("echo", real_namespace).spec.cluster_ip
    # kube-proxy programs the Service once its endpoints are there.
    wait_for(
        lambda: core.read_namespaced_endpoints("echo", real_namespace).subsets, 30, "endpoints"
    )
    for i, node in enumerate(names):
        # From each node: every echo pod (the others on other nodes) and the Service.
        urls = [f"http://{p.status.pod_ip}:{PORT}/" for p in echoes]
        urls.append(f"http://{service_ip}/")
        pod = pod_manifest(f"fetch-{i}", ["python3", "-c", _FETCH, *urls], nodeName=node)
        core.create_namespaced_pod(real_namespace, pod)
        done = wait_phase(core, None, real_namespace, f"fetch-{i}", {"Succeeded", "Failed"})
        answers = json.loads(core.read_namespaced_pod_log(f"fetch-{i}", real_namespace))
        expected = {f"http://{p.status.pod_ip}:{PORT}/": p.metadata.name for p in echoes}
        assert {u: a for u, a in answers.items() if u in expected} == expected, (node, answers)
        assert answers[f"http://{service_ip}/"] in expected.values(), (node, answers)
        assert done.status.phase == "Succeeded"


# --- a node lost ------------------------------------------------------------------------
#
# Each test loses an extra node of its own (the first runs the scheduler and kube-proxy
# for all); where a role runs is set by the CPU each node leaves free (placement.py), and
# the room for the lost pods' successors is made on the first node just before the loss.


def test_a_lost_node_s_workers_are_replaced_on_the_others_and_every_record_counts_once(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-worker")
    victim = node_loss.layout(core, job_namespace, real_session, "worker")
    lose_at = rng.randrange(20, node_loss.EPOCHS * STEPS_PER_EPOCH // 3)
    job, records = node_loss.train(real_cluster, job_namespace, tmp_path, "worker")
    try:
        placed, on_victim, lost_at = node_loss.lose_at_step(
            job, core, job_namespace, real_session, victim, lose_at
        )
        assert on_victim == ["worker", "worker"], placed
        lost_workers = {i for r, i, n in placed.values() if n == victim.name}

        def replacements_placed():
            ids = {e.data["id"] for e in job.events(follow=False) if e.kind == "relaunch"}
            now = {i: n for r, i, n in node_loss.placed(core, job_namespace).values() if i in ids}
            if len(ids) >= len(lost_workers) and len(now) == len(ids) and all(now.values()):
                return now
            return None

        ran_on = wait_for(replacements_placed, 180, "the replacements scheduled", poll=0.5)
        final = job.wait(timeout=600)
    finally:
        node_loss.close(job, core, job_namespace, real_session, victim)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    lost = node_loss.node_lost_events(events, "worker")
    assert {e.data["id"] for e in lost} == lost_workers
    assert {e.data["kind"] for e in lost} == {"preempted"}  # not the workers' fault
    relaunched = {e.data["replaces"]: e.data["id"] for e in events if e.kind == "relaunch"}
    assert set(relaunched) == lost_workers
    print(f"lost workers ended {lost[0].time - lost_at:.1f} s after the node")
    # Their replacements ran on the nodes left.
    assert victim.name not in set(ran_on.values()), ran_on
    assert ledger_problems(job.dir, 1, [records], node_loss.EPOCHS) == []


def test_a_lost_node_s_ps_is_relaunched_elsewhere_from_its_checkpoint(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-ps")
    victim = node_loss.layout(core, job_namespace, real_session, "ps")
    lose_at = rng.randrange(60, node_loss.EPOCHS * STEPS_PER_EPOCH // 3)  # after a PS checkpoint
    job, records = node_loss.train(real_cluster, job_namespace, tmp_path, "ps")
    try:
        placed, on_victim, lost_at = node_loss.lose_at_step(
            job, core, job_namespace, real_session, victim, lose_at
        )
        assert on_victim == ["ps"], placed
        final = job.wait(timeout=600)
    finally:
        node_loss.close(job, core, job_namespace, real_session, victim)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    (lost,) = node_loss.node_lost_events(events, "ps")
    assert lost.data["kind"] == "preempted"
    (relaunch,) = [e for e in events if e.kind == "relaunch"]
    assert (relaunch.data["role"], relaunch.data["id"]) == ("ps", 0)
    # The new PS served again from its newest checkpoint, not from nothing.
    back = [e for e in events if e.kind == "instance" and e.seq > relaunch.seq
            and e.data["role"] == "ps" and "restored_version" in e.data]  # fmt: skip
    assert back and back[0].data["restored_version"] > 0, back
    print(
        f"PS lost {lost.time - lost_at:.1f} s after its node, serving again "
        f"{back[0].time - lost_at:.1f} s after it (version {back[0].data['restored_version']})"
    )
    assert ledger_problems(job.dir, 1, [records], node_loss.EPOCHS) == []


def test_a_master_frozen_on_a_cut_off_node_is_fenced_by_its_lease_and_adds_nothing_after(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    """The master's node cut off while it runs on: its kubelet and the master's processes
    frozen (SIGSTOP) at a random step, and its pod force-deleted (what an admin's
    `kubectl delete --force`, or a node controller that gave up on the node, leaves: the
    Job makes a new master pod while the old master still runs). The new master takes
    the job's lease once it expired and takes the job over; thawed, the old master finds
    its lease lost and exits without another journal event; the job succeeds, every
    record applied once."""
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("fenced-master")
    # The master alone on the victim, as in the next test (this one does not lose it).
    victim = node_loss.layout(core, job_namespace, real_session, "master")
    freeze_at = rng.randrange(20, node_loss.EPOCHS * STEPS_PER_EPOCH // 3)
    job, records = node_loss.train(real_cluster, job_namespace, tmp_path, "master")
    # The journal read from the shared volume: the client's port-forward to the master
    # would go through the frozen kubelet.
    journal = job.dir / "events.jsonl"
    kubelet = victim.procs["kubelet"].pid
    frozen: list[int] = []
    try:
        wait_for_step(job, freeze_at, timeout=300)
        placed = node_loss.placed(core, job_namespace)
        assert [r for r, _, n in placed.values() if n == victim.name] == ["master"], placed
        (old_pod,) = [name for name, (r, _, _) in placed.items() if r == "master"]
        status = core.read_namespaced_pod(old_pod, job_namespace).status
        master_pid = victim.container_pid(status.container_statuses[0].container_id)
        frozen = [kubelet, *node_loss.process_tree(master_pid)]
        node_loss.signal_all(frozen, signal.SIGSTOP)
        frozen_at = time.time()
        core.patch_node(victim.name, {"spec": {"unschedulable": True}})
        node_loss.make_room_on_the_first_node(core, job_namespace, real_session)
        core.delete_namespaced_pod(old_pod, job_namespace, grace_period_seconds=0)
        print(f"froze {victim.name}'s kubelet and master {master_pid} at step {freeze_at}")

        def taken_over():
            events = read_journal_file(journal)
            return next((e for e in events if e.kind == "master_restarted"), None)

        restart = wait_for(taken_over, 180, "a new master to take the job over", poll=0.5)
        node_loss.signal_all(
            frozen[1:], signal.SIGCONT
        )  # the old master thaws, its kubelet not yet
        thawed_at = time.time()
        wait_for(lambda: not Path(f"/proc/{master_pid}").exists(), 30, "the old master to go")
        gone_at = time.time()
        node_loss.signal_all([kubelet], signal.SIGCONT)
        final = job.wait(timeout=600)
    finally:
        node_loss.signal_all(frozen, signal.SIGCONT)
        core.patch_node(victim.name, {"spec": {"unschedulable": False}})
        node_loss.close(job, core, job_namespace, real_session, victim)
        real_session.cluster.restart_controller_manager()  # (the node may have gone NotReady)
    assert final["state"] == "succeeded", final.get("error")

    # The successor waited for the lease to expire, not for the old master to go.
    assert restart.time - frozen_at >= master_lease.LEASE_SECONDS, restart.time - frozen_at
    assert restart.data["adopted"] == 4  # the PS and three workers went on in their pods
    log = (job.dir / "logs" / "master.log").read_text()
    assert "this master stops acting and exits" in log
    events = list(read_journal_file(journal))
    assert [e.seq for e in events] == list(range(len(events)))  # one writer at a time
    assert ledger_problems(job.dir, 1, [records], node_loss.EPOCHS) == []
    print(
        f"a new master took over {restart.time - frozen_at:.1f} s after the freeze; the old "
        f"one, thawed, exited within {gone_at - thawed_at:.1f} s"
    )


def test_a_lost_node_s_master_is_followed_by_a_new_pod_that_takes_the_job_over(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-master")
    victim = node_loss.layout(core, job_namespace, real_session, "master")
    lose_at = rng.randrange(20, node_loss.EPOCHS * STEPS_PER_EPOCH // 3)
    job, records = node_loss.train(real_cluster, job_namespace, tmp_path, "master")
    try:
        placed, on_victim, lost_at = node_loss.lose_at_step(
            job, core, job_namespace, real_session, victim, lose_at
        )
        assert on_victim == ["master"], placed
        final = job.wait(timeout=600)
    finally:
        node_loss.close(job, core, job_namespace, real_session, victim)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    (restart,) = [e for e in events if e.kind == "master_restarted"]
    assert restart.data["adopted"] == 4  # the PS and three workers went on in their pods
    assert not [e for e in events if e.kind == "relaunch"]
    print(
        f"a new master took over {restart.time - lost_at:.1f} s after the node was lost "
        f"(rebuilt in {restart.data['rebuild_s'] * 1000:.0f} ms)"
    )
    assert ledger_problems(job.dir, 1, [records], node_loss.EPOCHS) == []
