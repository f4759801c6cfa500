"""Three real nodes on one machine (extra_node.py, conftest's `three_nodes`): what the
tests of node loss rely on. The scheduler spreads a Deployment over them, and a pod on
every node reaches the pods of the others and a Service (kube-proxy on the first node
serves all: the nodes share the host's network namespace).

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_several_nodes.py
"""

from __future__ import annotations

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
EXTRA_FREE_M = 350  # three workers of 100m split 2 + 1, and room for the lost ones' places


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


def test_a_lost_node_s_workers_are_replaced_on_the_others_and_every_record_counts_once(
    three_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-worker")
    leave_free(core, job_namespace, real_session.node.name, 2 * 400)
    for node in real_session.extra:
        leave_free(core, job_namespace, node.name, EXTRA_FREE_M)
    epochs = 30
    lose_at = rng.randrange(20, epochs * STEPS_PER_EPOCH // 4)
    (x, y), _ = digits_split()
    options = k8s_options(real_cluster, job_namespace, tmp_path)
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=3,
        epochs=epochs,
        minibatch_size=32,
        checkpoint_steps=40,
        record_ledger=True,
        **{**options, "master_resources": BIG, "ps_resources": BIG},
    )
    victim = None
    try:
        wait_for_step(job, lose_at, timeout=300)
        placed = _placed(core, job_namespace)
        print(f"placed: {placed}")
        first = real_session.node.name
        assert {n for r, _, n in placed.values() if r in ("master", "ps")} == {first}, placed
        with_workers = sorted({n for r, _, n in placed.values() if r == "worker"})
        assert first not in with_workers, placed
        chosen = rng.choice(with_workers)
        victim = next(n for n in real_session.extra if n.name == chosen)
        lost_workers = {i for r, i, n in placed.values() if r == "worker" and n == victim.name}
        victim.lose()
        lost_at = time.time()
        print(f"lost {victim.name} with workers {sorted(lost_workers)} at step {lose_at}")

        def replacements_placed():
            ids = {e.data["id"] for e in job.events(follow=False) if e.kind == "relaunch"}
            now = {i: n for r, i, n in _placed(core, job_namespace).values() if i in ids}
            if len(ids) >= len(lost_workers) and len(now) == len(ids) and all(now.values()):
                return now
            return None

        ran_on = wait_for(replacements_placed, 180, "the replacements scheduled", poll=0.5)
        final = job.wait(timeout=600)
    finally:
        if job._link._forward is not None:
            job._link._forward.close()
        if victim is not None:  # the module's next tests get three nodes again
            _, undone = real_session.replace(victim)
            assert not undone, undone
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    lost = [e for e in events if e.kind == "instance" and "NodeLost" in e.data.get("reason", "")]
    assert {e.data["id"] for e in lost} == lost_workers
    assert {e.data["kind"] for e in lost} == {"preempted"}  # not the workers' fault
    relaunched = {e.data["replaces"]: e.data["id"] for e in events if e.kind == "relaunch"}
    assert set(relaunched) == lost_workers
    print(f"lost workers ended {lost[0].time - lost_at:.1f} s after the node")
    # Their replacements ran on the nodes left.
    assert victim.name not in set(ran_on.values()), ran_on
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
