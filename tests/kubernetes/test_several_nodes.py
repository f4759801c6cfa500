"""Three real nodes on one machine (extra_node.py, conftest's `three_nodes`): what the
tests of node loss rely on. The scheduler spreads a Deployment over them, and a pod on
every node reaches the pods of the others and a Service (kube-proxy on the first node
serves all: the nodes share the host's network namespace).

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_several_nodes.py
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.integration.faults import wait_for
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
