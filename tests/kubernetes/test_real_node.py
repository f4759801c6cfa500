"""The real node itself (node.py, conftest's `real_node`): containerd + runc, kubelet,
kube-scheduler and kube-proxy beside a test cluster of their own, with the job image
`make test-node` builds. These check what the job tests on it (test_kubernetes_*.py)
rely on: pods of our image, Services, the network's bounds, port-forward.

`make test` builds what they need (`make test-node`) and runs them; alone:

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_real_node.py

A failed test shows the node's logs (conftest's pytest_runtest_makereport).
"""

from __future__ import annotations

import errno
import socket
import textwrap
import time

import pytest

from tests.integration.faults import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.kubernetes,
]


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


def test_port_forward_through_the_api_server_reaches_a_pod_port_for_the_user_role(
    real_node, real_cluster, real_admin, job_namespace
):
    """As the notebook's user, holding only deploy/rbac.yaml's user Role: the Python
    client's port-forward is a websocket, a GET (kubectl's SPDY is a POST)."""
    from kubernetes import client, config
    from kubernetes.stream import portforward

    _serve(client.CoreV1Api(real_admin), real_node, job_namespace)
    user = config.new_client_from_config(config_file=str(real_cluster.user_kubeconfig))
    core = client.CoreV1Api(user)
    t0 = time.monotonic()
    forward = portforward(
        core.connect_get_namespaced_pod_portforward, "web", job_namespace, ports="8080"
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


RESOLVER = textwrap.dedent(
    """
    import os, socket, sys, time, urllib.request
    print(open("/etc/resolv.conf").read().replace("\\n", " | "))
    name = "web.%s.svc" % os.environ["NS"]
    def lookup(host):
        t0 = time.monotonic()
        try:
            return socket.gethostbyname(host), time.monotonic() - t0
        except OSError as exc:
            return type(exc).__name__, time.monotonic() - t0
    # The records follow the Services' watch, as CoreDNS's do: a name may come a moment
    # after its Service (a busy machine), so wait for it before the checks, bounded.
    t0 = time.monotonic()
    while not lookup(name)[0][0].isdigit() and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    print("record", round(time.monotonic() - t0, 2), flush=True)
    print("short", *lookup(name))
    print("full", *lookup(name + ".cluster.local"))
    print("unknown", *lookup("nothing.%s.svc" % os.environ["NS"]), flush=True)
    for attempt in range(60):  # (kube-proxy may not have the Service's rules yet)
        try:
            with urllib.request.urlopen("http://%s/hostname" % name, timeout=5) as r:
                print("by-name", r.status, flush=True)
                break
        except OSError as exc:
            print("not yet:", exc, flush=True)
            time.sleep(0.5)
    else:
        sys.exit("gave up on http://%s/hostname" % name)
    while lookup(name)[0][0].isdigit():  # until the deleted Service's record is gone
        time.sleep(0.2)
    print("gone", *lookup(name))
    """
)


def test_pods_resolve_a_service_by_its_name_through_the_cluster_dns(
    real_node, real_admin, real_namespace
):
    """dnsmasq and the records of every Service (cluster_dns.py): `NAME.NS.svc` and the
    full name answer with the Service's cluster IP, an unknown name fails at once (the
    server is the authority for cluster.local), and a deleted Service's name goes."""
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    cluster_ip = _serve(core, real_node, real_namespace)
    core.create_namespaced_pod(
        real_namespace,
        pod_manifest(
            "resolver",
            ["python3", "-c", RESOLVER],
            container={"env": [{"name": "NS", "value": real_namespace}]},
        ),
    )

    def said(prefix: str) -> list[str]:
        try:
            log = core.read_namespaced_pod_log("resolver", real_namespace) or ""
        except client.ApiException:  # (no container yet)
            return []
        return next((line.split()[1:] for line in log.splitlines() if line.startswith(prefix)), [])

    def fetched_or_ended() -> bool:
        phase = core.read_namespaced_pod("resolver", real_namespace).status.phase
        return bool(said("by-name")) or phase in ("Succeeded", "Failed")

    wait_for(fetched_or_ended, 90, "the resolver's lookups")
    log = core.read_namespaced_pod_log("resolver", real_namespace)
    assert said("by-name") == ["200"], log
    assert f"search {real_namespace}.svc.cluster.local" in log, log
    assert said("short")[0] == cluster_ip and said("full")[0] == cluster_ip, log
    unknown, seconds = said("unknown")
    assert unknown == "gaierror" and float(seconds) < 1.0, log  # NXDOMAIN, not a timeout
    # (not parsed: this client's models refuse the 1.20 API server's reply to it)
    core.delete_namespaced_service("web", real_namespace, _preload_content=False)
    pod = wait_phase(core, real_node, real_namespace, "resolver", ("Succeeded", "Failed"), 30)
    assert pod.status.phase == "Succeeded" and said("gone")[0] == "gaierror", log


ROUTE = textwrap.dedent(
    """
    import os, time, urllib.request
    from pathlib import Path
    from elasticdl_nb.backends.job_records import JobRecord
    from elasticdl_nb.backends.kubernetes.master_link import KubernetesMasterLink
    where = {"namespace": os.environ["NS"], "master_address": os.environ["CLUSTER_IP"]}
    link = KubernetesMasterLink(JobRecord("probe", Path("/tmp"), "-", 0.0, "kubernetes", where))
    t0 = time.monotonic()
    route = link.route()
    print("route", route, round(time.monotonic() - t0, 2), flush=True)
    for _ in range(60):  # (kube-proxy may not have the Service's rules yet)
        try:
            with urllib.request.urlopen("http://%s/hostname" % route, timeout=10) as r:
                print("reached", r.status)
                break
        except OSError as exc:
            print("not yet:", exc, flush=True)
            time.sleep(0.5)
    """
)


def test_a_notebook_in_a_pod_reaches_the_master_by_name_or_else_by_cluster_ip(
    real_node, real_admin, real_namespace
):
    """The client's route to a job's master from inside a pod (master_link.route): the
    Service's DNS name where the cluster's DNS answers; where it does not (a pod whose
    resolver is an address nobody serves), the Service's cluster IP, within the lookup's
    bound, rather than every call failing on the name. Both pods run side by side."""
    from kubernetes import client

    from elasticdl_nb.backends.kubernetes import manifests as m
    from elasticdl_nb.backends.kubernetes.master_link import DNS_SECONDS

    core = client.CoreV1Api(real_admin)
    _serve(core, real_node, real_namespace)
    core.create_namespaced_service(  # as a job's master's Service would be named
        real_namespace,
        {
            "metadata": {"name": m.master_name("probe")},
            "spec": {
                "selector": {"app": "web"},
                "ports": [{"port": m.MASTER_PORT, "targetPort": 8080}],
            },
        },
    )
    service = core.read_namespaced_service(m.master_name("probe"), real_namespace)
    cluster_ip = f"{service.spec.cluster_ip}:{m.MASTER_PORT}"
    by_name = f"{m.master_name('probe')}.{real_namespace}.svc:{m.MASTER_PORT}"
    dead_resolver = {
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["10.244.0.254"], "searches": ["svc.cluster.local"]},
    }
    env = [{"name": "NS", "value": real_namespace}, {"name": "CLUSTER_IP", "value": cluster_ip}]
    expected = {"router-dns": (by_name, {}), "router-no-dns": (cluster_ip, dead_resolver)}
    for name, (_, resolver) in expected.items():
        command = ["python3", "-c", ROUTE]
        core.create_namespaced_pod(
            real_namespace, pod_manifest(name, command, container={"env": env}, **resolver)
        )
    for name, (route_expected, _) in expected.items():
        pod = wait_phase(core, real_node, real_namespace, name, ("Succeeded", "Failed"), 90)
        log = core.read_namespaced_pod_log(name, real_namespace)
        assert pod.status.phase == "Succeeded", (name, log)
        line = next(line for line in log.splitlines() if line.startswith("route"))
        _, route, seconds = line.split()
        assert route == route_expected and float(seconds) <= DNS_SECONDS + 0.5, (name, log)
        assert "reached 200" in log, (name, log)
