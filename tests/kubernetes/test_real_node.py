"""Pods on a real node (node.py): containerd + runc, kubelet, kube-scheduler and
kube-proxy beside a test cluster of their own, with the job image `make test-node` builds.

`make test` builds what they need (`make test-node`) and runs them; alone:

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_real_node.py

The session's cluster (`k8s_cluster`) is not touched: this module starts a second
cluster for the node, on the node's address and Service range. A failed test shows the
node's logs (conftest's pytest_runtest_makereport). After a run killed without its
teardown, `python -m tests.kubernetes.node --clean` undoes the node.
"""

from __future__ import annotations

import errno
import socket
import textwrap
import time
import uuid

import pytest

from tests.integration.faults import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.kubernetes,
]


@pytest.fixture(scope="session")
def real_node(tmp_path_factory):
    """A second TestCluster, configured for a real node, and the RealNode on it. At the
    end both stop, and the machine must be as before (`leftovers()`)."""
    from tests.kubernetes.cluster import TestCluster
    from tests.kubernetes.node import RealNode

    logs = tmp_path_factory.mktemp("real-node-logs")
    node = RealNode(logs=logs).prepare()
    cluster = TestCluster(workdir=tmp_path_factory.mktemp("real-cluster"), **node.cluster_options())
    try:
        cluster.start()
        node.start(cluster)
    except BaseException:
        node.stop()
        cluster.stop(keep_workdir=True)
        raise
    print(f"\nreal node up: {node.timings} (cluster {cluster.start_seconds:.1f} s); logs {logs}")
    yield node
    t0 = time.monotonic()
    problems = node.stop()
    t1 = time.monotonic()
    cluster.stop()
    print(f"\nnode stopped in {t1 - t0:.1f} s, cluster in {time.monotonic() - t1:.1f} s")
    left = node.leftovers()
    assert not problems and not left, f"not undone: {problems}; left on the machine: {left}"


@pytest.fixture(scope="session")
def real_admin(real_node):
    from kubernetes import config

    with config.new_client_from_config(config_file=str(real_node.cluster.admin_kubeconfig)) as c:
        yield c


@pytest.fixture
def real_namespace(real_node, real_admin):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    real_node.cluster.wait_for_default_service_account(name)
    yield name
    core.delete_namespace(name)


def pod_manifest(name: str, command: list[str], **spec) -> dict:
    from tests.kubernetes.node import job_image_name

    container = {"name": "main", "image": job_image_name(), "command": command}
    container.update(spec.pop("container", {}))
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            **spec,
        },
    }


def wait_phase(core, node, namespace: str, name: str, phases, timeout: float = 60):
    """The pod once its phase is one of `phases`; on timeout, its status in the failure
    (the node's logs come with every failure: conftest's pytest_runtest_makereport)."""
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases:
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {name} not {phases} after {timeout} s: {pod.status}")
        time.sleep(0.1)


def test_a_pod_of_the_job_image_runs_as_uid_1000_and_its_log_is_read_through_the_api(
    real_node, real_admin, real_namespace
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    t0 = time.monotonic()
    core.create_namespaced_pod(
        real_namespace,
        pod_manifest(
            "who",
            ["sh", "-c", "echo uid=$(id -u); python3 -c 'import elasticdl_nb; print(\"edl ok\")'"],
        ),
    )
    wait_phase(core, real_node, real_namespace, "who", ("Running", "Succeeded", "Failed"))
    running = time.monotonic() - t0
    pod = wait_phase(core, real_node, real_namespace, "who", ("Succeeded", "Failed"))
    log = core.read_namespaced_pod_log("who", real_namespace)
    print(f"pod Running after {running:.1f} s, done after {time.monotonic() - t0:.1f} s")
    assert pod.status.phase == "Succeeded", f"{pod.status}\nlog: {log}"
    assert "uid=1000" in log and "edl ok" in log, f"log: {log!r}"
    (status,) = pod.status.container_statuses
    assert status.container_id.startswith("containerd://"), status
    assert pod.spec.node_name == real_node.name
    assert pod.status.pod_ip.startswith("10.244.0."), pod.status.pod_ip


SERVER = ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0", "--directory", "/etc"]

CLIENT = textwrap.dedent(
    """
    import json, os, ssl, sys, time, urllib.request
    def get(url, **kw):
        for attempt in range(60):
            try:
                with urllib.request.urlopen(url, timeout=5, **kw) as r:
                    return r.status, r.read()
            except OSError as exc:
                print("retry", url, exc, flush=True)
                time.sleep(0.5)
        sys.exit("gave up on " + str(url))
    status, body = get("http://%s/hostname" % os.environ["TARGET"])
    print("service", status, body.decode().strip())
    sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
    req = urllib.request.Request(
        "https://%s:%s/version" % (os.environ["KUBERNETES_SERVICE_HOST"],
                                   os.environ["KUBERNETES_SERVICE_PORT"]),
        headers={"Authorization": "Bearer " + open(sa + "token").read()})
    status, body = get(req, context=ssl.create_default_context(cafile=sa + "ca.crt"))
    print("api", status, json.loads(body)["gitVersion"])
    import errno, socket
    s = socket.socket()
    s.settimeout(3)
    code = s.connect_ex(("203.0.113.1", 80))  # TEST-NET-3: anywhere beyond this machine
    print("beyond", errno.errorcode.get(code, code))
    """
)


def _serve(core, node, namespace: str):
    """A pod serving /etc over HTTP on 8080, and a Service on port 80 to it."""
    core.create_namespaced_pod(namespace, pod_manifest("web", SERVER))
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    wait_phase(core, node, namespace, "web", ("Running",))

    def endpoint_ready():
        ep = core.read_namespaced_endpoints("web", namespace)
        return any(s.addresses for s in ep.subsets or [])

    wait_for(endpoint_ready, 30, "the web Service's endpoint")
    return core.read_namespaced_service("web", namespace).spec.cluster_ip


def test_a_service_ip_reaches_a_pod_and_a_pod_reaches_the_api_server_by_its_service(
    real_node, real_admin, real_namespace
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    cluster_ip = _serve(core, real_node, real_namespace)
    assert cluster_ip.startswith("10.96.0."), cluster_ip
    core.create_namespaced_pod(
        real_namespace,
        pod_manifest(
            "client",
            ["python3", "-c", CLIENT],
            container={"env": [{"name": "TARGET", "value": cluster_ip}]},
        ),
    )
    pod = wait_phase(core, real_node, real_namespace, "client", ("Succeeded", "Failed"), 90)
    log = core.read_namespaced_pod_log("client", real_namespace)
    tails = f"client log:\n{log}\nkube-proxy:\n{real_node.log_tail('kube-proxy', 40)}"
    assert pod.status.phase == "Succeeded", tails
    assert "service 200" in log, tails
    assert "api 200 v1.20.2" in log, tails
    # Nothing leaves the machine: a pod has no route beyond the Service range, and the
    # host none to the Service range (so an address no Service holds goes nowhere).
    assert "beyond ENETUNREACH" in log, tails
    with pytest.raises(OSError) as refused:
        socket.create_connection(("10.96.0.250", 80), timeout=3)
    assert refused.value.errno == errno.EHOSTUNREACH, refused.value


def test_port_forward_through_the_api_server_reaches_a_pod_port(
    real_node, real_admin, real_namespace
):
    from kubernetes import client
    from kubernetes.stream import portforward

    core = client.CoreV1Api(real_admin)
    _serve(core, real_node, real_namespace)
    t0 = time.monotonic()
    forward = portforward(
        core.connect_get_namespaced_pod_portforward, "web", real_namespace, ports="8080"
    )
    sock = forward.socket(8080)
    sock.settimeout(20)
    sock.sendall(b"GET /hostname HTTP/1.0\r\nHost: web\r\n\r\n")
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    sock.close()
    print(f"port-forward reply in {time.monotonic() - t0:.1f} s")
    assert reply.startswith(b"HTTP/1.0 200"), f"{reply[:300]!r}"


def test_a_notebook_cell_trains_on_the_real_node(
    ipython_shell, job_home, real_node, real_admin, real_namespace, tmp_path
):
    from kubernetes import client

    from tests.integration.models import COMPILED_MODEL, digits_split
    from tests.kubernetes.access import ensure_priority_classes, grant_rbac_yaml

    core = client.CoreV1Api(real_admin)
    cluster = real_node.cluster
    ensure_priority_classes(real_admin)
    grant_rbac_yaml(real_admin, real_namespace, cluster.user_name)

    def master_account_has_its_token():
        account = core.read_namespaced_service_account("elasticdl-nb-master", real_namespace)
        return bool(account.secrets)

    wait_for(master_account_has_its_token, 30, "the master service account's token")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # hostPath ignores fsGroup: the pods' uid 1000 must write here

    shell = ipython_shell
    (x, y), (xt, yt) = digits_split()
    shell.user_ns.update(x_train=x, y_train=y, x_test=xt, y_test=yt)
    for name in ("custom_model", "loss", "optimizer", "model", "feed", "eval_metrics_fn"):
        shell.user_ns.pop(name, None)
    small = "cpu=100m,memory=1Gi"
    line = (
        f"train --backend kubernetes --namespace {real_namespace}"
        f" --kubeconfig {cluster.user_kubeconfig} --shared-volume hostPath:{shared}"
        f" --master-resources {small} --worker-resources {small} --ps-resources {small}"
        " --workers 2 --epochs 4 --minibatch-size 32"
        " --data x_train y_train --validation-data x_test y_test -o rjob --wait"
    )
    t0 = time.monotonic()
    shell.run_cell_magic("elasticdl", line, textwrap.dedent(COMPILED_MODEL))
    took = time.monotonic() - t0
    job = shell.user_ns["rjob"]
    status = job.status()
    master = f"{job.name}-master"
    try:
        master_log = core.read_namespaced_pod_log(master, real_namespace, tail_lines=40)
    except Exception as exc:  # noqa: BLE001 - only for the message
        master_log = f"(no log: {exc})"
    why = f"{status}\nmaster log:\n{master_log}"
    print(f"notebook job on the real node: {took:.1f} s")
    assert status["state"] == "succeeded", why
    assert status["metrics"]["accuracy"] >= 0.85, why
    # The master pod stays, finished: it ran in a container of our image on this node.
    pod = core.read_namespaced_pod(master, real_namespace)
    assert pod.spec.node_name == real_node.name
    (container,) = pod.status.container_statuses
    assert container.container_id.startswith("containerd://"), container
    assert container.image.endswith(real_node.job_image_ref().split("/", 1)[1]), container
    events = list(job.events(follow=False))
    running = {(e.data["role"], e.data["id"]) for e in events if e.kind == "instance"
               and e.data["kind"] == "running"}  # fmt: skip
    assert {("worker", 0), ("worker", 1), ("ps", 0)} <= running, why
    # The notebook is outside the pod network: it reached the master by port-forward.
    link = job._link
    try:
        assert link._route and link._route.startswith("127.0.0.1:"), link._route
    finally:
        if link._forward is not None:  # before the API server goes, at the session's end
            link._forward.close()
