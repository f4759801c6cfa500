"""Three real nodes on one machine (extra_node.py, conftest's `three_nodes`): what the
tests of node loss rely on. The scheduler spreads a Deployment over them, and a pod on
every node reaches the pods of the others and a Service (kube-proxy on the first node
serves all: the nodes share the host's network namespace).

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_several_nodes.py
"""

from __future__ import annotations

import contextlib
import json
import textwrap
import time

import pytest

import elasticdl_nb as edl
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split
from tests.kubernetes.job_pods import k8s_options, pods
from tests.kubernetes.placement import leave_free
from tests.kubernetes.test_kubernetes_jobs import STEPS_PER_EPOCH, _paced_loss
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


def test_the_scheduler_spreads_pods_over_three_nodes_which_reach_each_other_and_services(
    three_nodes, real_admin, real_namespace
):
    from kubernetes import client

    core, apps = client.CoreV1Api(real_admin), client.AppsV1Api(real_admin)
    names = [n.name for n in three_nodes]
    ready = {
        n.metadata.name
        for n in core.list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    }
    assert ready == set(names)

    apps.create_namespaced_deployment(real_namespace, _echo_deployment("echo", 3))
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
        return done if len(done) == 3 else None

    echoes = wait_for(all_ready, 120, "three echo pods Ready")
    by_node = {p.spec.node_name: p for p in echoes}
    assert set(by_node) == set(names), "the scheduler put two replicas on one node"

    service_ip = core.read_namespaced_service("echo", real_namespace).spec.cluster_ip
    # kube-proxy programs the Service once its endpoints are there.
    wait_for(
        lambda: core.read_namespaced_endpoints("echo", real_namespace).subsets, 30, "endpoints"
    )
    for i, node in enumerate(names):
        # From each node: every echo pod (two on other nodes) and the Service.
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

# The master and the PS ask for more CPU than an extra node leaves free, so they run on
# the first node (placement.py); the workers fit only on the extra nodes.
BIG = "cpu=400m,memory=1Gi"
MID = "cpu=300m,memory=1Gi"
EPOCHS = 30


def _placed(core, namespace: str) -> dict[str, tuple[str, int, str]]:
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


def _train(real_cluster, namespace: str, tmp_path, master: str, ps: str):
    """A PS job of three workers (100m each) that records its PS ledger; and its records."""
    (x, y), _ = digits_split()
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
        **{**options, "master_resources": master, "ps_resources": ps},
    )
    return job, len(x)


@contextlib.contextmanager
def _losing_a_node(real_session, job):
    """The body may lose an extra node (`lose(name)`, returns the wall-clock time);
    after it the job's port-forward is closed and a new node takes the lost one's place,
    so the module's next test has three nodes again."""
    lost = []

    def lose(name: str) -> float:
        node = next(n for n in real_session.extra if n.name == name)
        node.lose()
        lost.append(node)
        return time.time()

    try:
        yield lose
    finally:
        if job._link._forward is not None:
            job._link._forward.close()
        for node in lost:
            _, undone = real_session.replace(node)
            assert not undone, undone


def _node_lost_events(events, role: str) -> list:
    return [
        e for e in events
        if e.kind == "instance" and e.data["role"] == role
        and "NodeLost" in e.data.get("reason", "")
    ]  # fmt: skip


def test_a_lost_node_s_workers_are_replaced_on_the_others_and_every_record_counts_once(
    three_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-worker")
    first = real_session.node.name
    # The master and PS on the first node (only it has room for them), the workers split
    # 2 + 1 over the others, with room left for two replacements.
    leave_free(core, job_namespace, first, 2 * 400)
    for node in real_session.extra:
        leave_free(core, job_namespace, node.name, 350)
    lose_at = rng.randrange(20, EPOCHS * STEPS_PER_EPOCH // 4)
    job, records = _train(real_cluster, job_namespace, tmp_path, master=BIG, ps=BIG)
    with _losing_a_node(real_session, job) as lose:
        wait_for_step(job, lose_at, timeout=300)
        placed = _placed(core, job_namespace)
        print(f"placed: {placed}")
        assert {n for r, _, n in placed.values() if r in ("master", "ps")} == {first}, placed
        with_workers = sorted({n for r, _, n in placed.values() if r == "worker"})
        assert first not in with_workers, placed
        victim = rng.choice(with_workers)
        lost_workers = {i for r, i, n in placed.values() if r == "worker" and n == victim}
        lost_at = lose(victim)
        print(f"lost {victim} with workers {sorted(lost_workers)} at step {lose_at}")

        def replacements_placed():
            ids = {e.data["id"] for e in job.events(follow=False) if e.kind == "relaunch"}
            now = {i: n for r, i, n in _placed(core, job_namespace).values() if i in ids}
            if len(ids) >= len(lost_workers) and len(now) == len(ids) and all(now.values()):
                return now
            return None

        ran_on = wait_for(replacements_placed, 180, "the replacements scheduled", poll=0.5)
        final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    lost = _node_lost_events(events, "worker")
    assert {e.data["id"] for e in lost} == lost_workers
    assert {e.data["kind"] for e in lost} == {"preempted"}  # not the workers' fault
    relaunched = {e.data["replaces"]: e.data["id"] for e in events if e.kind == "relaunch"}
    assert set(relaunched) == lost_workers
    print(f"lost workers ended {lost[0].time - lost_at:.1f} s after the node")
    # Their replacements ran on the nodes left.
    assert victim not in set(ran_on.values()), ran_on
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []


def test_a_lost_node_s_ps_is_relaunched_elsewhere_from_its_checkpoint(
    three_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-ps")
    first = real_session.node.name
    # The master alone on the first node; the PS (300m) on one of the others, whose 50m
    # left then take no worker: the three workers on the third.
    leave_free(core, job_namespace, first, 400)
    for node in real_session.extra:
        leave_free(core, job_namespace, node.name, 350)
    lose_at = rng.randrange(60, EPOCHS * STEPS_PER_EPOCH // 4)  # after a PS checkpoint
    job, records = _train(real_cluster, job_namespace, tmp_path, master=BIG, ps=MID)
    with _losing_a_node(real_session, job) as lose:
        wait_for_step(job, lose_at, timeout=300)
        placed = _placed(core, job_namespace)
        print(f"placed: {placed}")
        (ps_node,) = {n for r, _, n in placed.values() if r == "ps"}
        assert ps_node != first and [r for r, _, n in placed.values() if n == ps_node] == ["ps"]
        # Room on the first node for the PS's relaunch.
        core.delete_namespaced_pod(f"ballast-{first}", job_namespace, grace_period_seconds=0)
        lost_at = lose(ps_node)
        print(f"lost {ps_node} with the PS at step {lose_at}")
        final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    (lost,) = _node_lost_events(events, "ps")
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
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []


def test_a_lost_node_s_master_is_followed_by_a_new_pod_that_takes_the_job_over(
    three_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-master")
    first = real_session.node.name
    # The master (400m) fits only on an extra node, which it then fills (50m left); the PS
    # and the workers go to the first node and the third.
    leave_free(core, job_namespace, first, 350)
    for node in real_session.extra:
        leave_free(core, job_namespace, node.name, 450)
    lose_at = rng.randrange(20, EPOCHS * STEPS_PER_EPOCH // 4)
    job, records = _train(real_cluster, job_namespace, tmp_path, master=BIG, ps=MID)
    with _losing_a_node(real_session, job) as lose:
        wait_for_step(job, lose_at, timeout=300)
        placed = _placed(core, job_namespace)
        print(f"placed: {placed}")
        (master_node,) = {n for r, _, n in placed.values() if r == "master"}
        assert [r for r, _, n in placed.values() if n == master_node] == ["master"], placed
        # Room on the first node for the master's next pod.
        core.delete_namespaced_pod(f"ballast-{first}", job_namespace, grace_period_seconds=0)
        lost_at = lose(master_node)
        print(f"lost {master_node} with the master at step {lose_at}")
        final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    (restart,) = [e for e in events if e.kind == "master_restarted"]
    assert restart.data["adopted"] == 4  # the PS and three workers went on in their pods
    assert not [e for e in events if e.kind == "relaunch"]
    print(
        f"a new master took over {restart.time - lost_at:.1f} s after the node was lost "
        f"(rebuilt in {restart.data['rebuild_s']:.2f} s)"
    )
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []
