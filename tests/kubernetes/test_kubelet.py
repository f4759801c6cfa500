"""The test kubelet (kubelet.py) against the real API server: pods scheduled or refused
for their requests, run as local processes with their env and volumes, reachable at
their Service's address, able to use in-cluster config, killed on deletion; and the
faults it injects reported as a real kubelet reports them."""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity

from tests.kubernetes.kubelet import LABEL_OFF, TestKubelet

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

SLEEPER = "import time; print('up', flush=True); time.sleep(600)"


def pod_manifest(
    name: str, code: str, labels=None, requests=None, volumes=(), spec=None, **container
) -> dict:
    """A pod whose one container runs `python -c code` (the venv's python); `container`
    and `spec` add fields to the container and the pod spec."""
    command = ["python", "-c", textwrap.dedent(code)]
    container = {"name": "main", "image": "python:3.11", "command": command, **container}
    if requests:
        container["resources"] = {"requests": requests}
    spec = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [*volumes],
        **(spec or {}),
    }
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def wait_for_pod(core, namespace: str, name: str, ready, what: str, timeout: float = 30):
    """Poll the pod (None once it is gone) until `ready(pod)`; fail with its last state."""
    deadline, pod = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            pod = None
        if ready(pod):
            return pod
        time.sleep(0.1)
    last = pod.status if pod else "gone"
    raise AssertionError(f"pod {name}: not {what} after {timeout}s; last status: {last}")


def wait_for(predicate, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.1)
    return value


def ended(pod) -> bool:
    return pod is not None and pod.status.phase in ("Succeeded", "Failed")


def running(pod) -> bool:
    return pod is not None and pod.status.phase == "Running"


def gone(pod) -> bool:
    return pod is None


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (an orphan nobody reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()  # "pid (command) state ..."
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def waiting(reason: str):
    """A check that the pod's container waits for `reason`."""

    def check(pod) -> bool:
        statuses = pod and pod.status.container_statuses
        state = statuses and statuses[0].state.waiting
        return bool(state and state.reason == reason)

    return check


def terminated(pod):
    return pod.status.container_statuses[0].state.terminated


@pytest.fixture
def core(k8s_admin_client):
    return client.CoreV1Api(k8s_admin_client)


def test_env_from_secret_and_fields_and_a_configmap_at_its_mount_path(
    core, k8s_namespace, k8s_kubelet, monkeypatch
):
    monkeypatch.setenv("KUBECONFIG", "/the/test/process/only")  # must not reach the pod
    ns = k8s_namespace
    core.create_namespaced_secret(
        ns, {"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}
    )
    binary = base64.b64encode(b"\x00\xff").decode()
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cfg"}, "data": {"a": "alpha", "b": "beta"},
             "binaryData": {"bin": binary}},
    )  # fmt: skip
    code = """
        import os, pathlib, sys
        cfg = pathlib.Path("/etc/x/cfg")
        print("secret", os.environ["PASSWORD"], "configmap", os.environ["B"])
        print("fields", os.environ["POD_NAME"], os.environ["POD_NAMESPACE"], os.environ["POD_IP"])
        print("first", (cfg / "first.txt").read_text())
        print("bin", (cfg / "sub" / "bin").read_bytes().hex())
        print("files", sorted(str(p.relative_to(cfg)) for p in cfg.rglob("*")))
        print("python", sys.executable, "KUBECONFIG" in os.environ)
        account = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
        print("sa", (account / "namespace").read_text())
    """
    env = [
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "b"}}},
        *({"name": f"POD_{f.upper()}", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{f}"}}}
          for f in ("name", "namespace")),
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]  # fmt: skip
    items = [{"key": "a", "path": "first.txt"}, {"key": "bin", "path": "sub/bin"}]
    volume = {"name": "cfg", "configMap": {"name": "cfg", "items": items}}
    mount = {"name": "cfg", "mountPath": "/etc/x/cfg", "readOnly": True}
    manifest = pod_manifest("reader", code, env=env, volumeMounts=[mount], volumes=[volume])
    core.create_namespaced_pod(ns, manifest)

    pod = wait_for_pod(core, ns, "reader", ended, "ended")
    logs = k8s_kubelet.logs(ns, "reader")
    assert pod.status.phase == "Succeeded", logs
    assert (terminated(pod).exit_code, terminated(pod).reason) == (0, "Completed")
    assert pod.spec.node_name == "test-node" and pod.status.host_ip == "127.0.0.1"
    assert pod.status.pod_ip.startswith("127.2.")
    assert "secret hunter2 configmap beta" in logs
    assert f"fields reader {ns} {pod.status.pod_ip}" in logs
    assert "first alpha" in logs and "bin 00ff" in logs
    assert "files ['first.txt', 'sub', 'sub/bin']" in logs  # only the items
    venv_python = Path(sys.executable).parent / "python"
    assert f"python {venv_python} False" in logs  # the venv's python; a clean env
    assert f"sa {ns}" in logs  # the service-account token volume
    assert not Path("/etc/x/cfg/first.txt").exists()  # mounted for the pod only


def test_exit_codes_a_termination_message_and_a_kill_by_signal(core, k8s_namespace, k8s_kubelet):
    ns = k8s_namespace
    code = "open('/dev/termination-log', 'w').write('bad config'); raise SystemExit(3)"
    core.create_namespaced_pod(ns, pod_manifest("three", code))
    core.create_namespaced_pod(ns, pod_manifest("victim", SLEEPER))

    pod = wait_for_pod(core, ns, "three", ended, "ended")
    assert pod.status.phase == "Failed"
    assert terminated(pod).exit_code == 3 and terminated(pod).reason == "Error"
    assert terminated(pod).message == "bad config"

    pod = wait_for_pod(core, ns, "victim", running, "running")
    state = pod.status.container_statuses[0]
    assert state.ready and state.state.running.started_at and state.restart_count == 0
    assert {c.type: c.status for c in pod.status.conditions} == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"
    }  # fmt: skip
    pid = k8s_kubelet.pid(ns, "victim")
    os.kill(pid, signal.SIGKILL)  # the command's own pid, not a wrapper's
    pod = wait_for_pod(core, ns, "victim", ended, "ended")
    assert pod.status.phase == "Failed"
    assert (terminated(pod).exit_code, terminated(pod).reason) == (137, "Error")


def test_deleting_a_pod_kills_its_process_within_the_grace_period(core, k8s_namespace, k8s_kubelet):
    ns = k8s_namespace
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEPER
    core.create_namespaced_pod(ns, pod_manifest("sleeper", SLEEPER))
    core.create_namespaced_pod(
        ns, pod_manifest("stubborn", stubborn, spec={"terminationGracePeriodSeconds": 2})
    )
    pids = {}
    for name in ("sleeper", "stubborn"):
        wait_for_pod(core, ns, name, running, "running")
        wait_for(lambda name=name: "up" in k8s_kubelet.logs(ns, name), f"{name} up")
        pids[name] = k8s_kubelet.pid(ns, name)

    core.delete_namespaced_pod("sleeper", ns)  # 30 s grace, but SIGTERM ends it
    wait_for_pod(core, ns, "sleeper", gone, "deleted", timeout=8)
    assert not alive(pids["sleeper"]) and k8s_kubelet.pid(ns, "sleeper") is None

    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", ns)  # ignores SIGTERM: SIGKILL after 2 s
    wait_for_pod(core, ns, "stubborn", gone, "deleted", timeout=15)
    assert time.monotonic() - started >= 1.5
    assert not alive(pids["stubborn"])


def test_a_pod_selected_by_a_service_serves_at_the_service_address(
    core, k8s_namespace, k8s_kubelet
):
    ns = k8s_namespace
    service = core.create_namespaced_service(
        ns, {"metadata": {"name": "echo"},
             "spec": {"selector": {"app": "echo"}, "ports": [{"port": 7000}]}},
    )  # fmt: skip
    address = service.spec.cluster_ip
    assert address.startswith("127.1.")  # cluster.py's loopback service range
    code = """
        import os, socket
        server = socket.create_server((os.environ["POD_IP"], 7000))
        print("listening", flush=True)
        conn, _ = server.accept()
        conn.sendall(conn.recv(100).upper())
    """
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    core.create_namespaced_pod(ns, pod_manifest("server", code, labels={"app": "echo"}, env=env))

    pod = wait_for_pod(core, ns, "server", running, "running")
    assert pod.status.pod_ip == address and pod.status.pod_ips[0].ip == address
    wait_for(lambda: "listening" in k8s_kubelet.logs(ns, "server"), "listening")
    with socket.create_connection((address, 7000), timeout=10) as conn:
        conn.sendall(b"ping")
        assert conn.recv(100) == b"PING"
    assert wait_for_pod(core, ns, "server", ended, "ended").status.phase == "Succeeded"


def test_in_cluster_config_reaches_the_api_server_as_the_service_account(
    k8s_admin_client, core, k8s_namespace, k8s_kubelet
):
    ns = k8s_namespace
    rbac = client.RbacAuthorizationV1Api(k8s_admin_client)
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    rbac.create_namespaced_role(ns, {"metadata": {"name": "read-pods"}, "rules": [rule]})
    rbac.create_namespaced_role_binding(
        ns, {"metadata": {"name": "read-pods"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "read-pods"},
             "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]},
    )  # fmt: skip
    code = """
        import os
        from kubernetes import client, config
        config.load_incluster_config()
        namespace = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
        me = client.CoreV1Api().read_namespaced_pod(os.environ["HOSTNAME"], namespace)
        print("read", me.metadata.name, me.status.phase, me.status.pod_ip)
    """
    core.create_namespaced_pod(ns, pod_manifest("incluster", code))

    pod = wait_for_pod(core, ns, "incluster", ended, "ended", timeout=60)
    logs = k8s_kubelet.logs(ns, "incluster")
    assert pod.status.phase == "Succeeded", logs
    assert f"read incluster Running {pod.status.pod_ip}" in logs


def test_oom_kill_and_eviction_are_reported_as_a_kubelet_does(core, k8s_namespace, k8s_kubelet):
    ns = k8s_namespace
    for name in ("oom", "evicted"):
        core.create_namespaced_pod(ns, pod_manifest(name, SLEEPER))
    pids = [wait_for(lambda n=n: k8s_kubelet.pid(ns, n), n) for n in ("oom", "evicted")]

    k8s_kubelet.oom_kill(ns, "oom")
    k8s_kubelet.evict(ns, "evicted")

    pod = wait_for_pod(core, ns, "oom", ended, "ended")
    assert pod.status.phase == "Failed"
    assert (terminated(pod).exit_code, terminated(pod).reason) == (137, "OOMKilled")
    pod = wait_for_pod(core, ns, "evicted", ended, "ended")
    assert (pod.status.phase, pod.status.reason) == ("Failed", "Evicted")
    assert pod.status.message == "The node was low on resource: memory."
    assert terminated(pod).exit_code == 137
    assert not any(alive(pid) for pid in pids)


def test_preemption_marks_the_pod_then_deletes_it(core, k8s_namespace, k8s_kubelet):
    ns = k8s_namespace
    core.create_namespaced_pod(ns, pod_manifest("victim", SLEEPER))
    pod = wait_for_pod(core, ns, "victim", running, "running")
    pid = k8s_kubelet.pid(ns, "victim")

    k8s_kubelet.preempt(ns, "victim")

    seen = []
    stream = watch.Watch().stream(
        core.list_namespaced_pod, ns, field_selector="metadata.name=victim",
        resource_version=pod.metadata.resource_version, timeout_seconds=30,
    )  # fmt: skip
    for event in stream:
        seen.append(event)
        if event["type"] == "DELETED":
            break
    assert seen[-1]["type"] == "DELETED", [e["type"] for e in seen]
    last = seen[-1]["object"]  # as it was when the kubelet confirmed the deletion
    conditions = {c.type: c for c in last.status.conditions}
    assert conditions["DisruptionTarget"].reason == "PreemptionByScheduler"
    assert terminated(last).exit_code == 143  # SIGTERM
    assert not alive(pid)


def test_requests_beyond_the_node_wait_unschedulable_until_room_is_made(
    core, k8s_namespace, k8s_kubelet
):
    ns = k8s_namespace
    memory = parse_quantity(k8s_kubelet.capacity["memory"])
    huge, most = {"memory": f"{memory * 2:.0f}"}, {"memory": f"{memory * 6 // 10:.0f}"}
    core.create_namespaced_pod(ns, pod_manifest("huge", "", requests=huge))
    core.create_namespaced_pod(ns, pod_manifest("hog", SLEEPER, requests=most))
    wait_for_pod(core, ns, "hog", running, "running")
    core.create_namespaced_pod(ns, pod_manifest("next", "", requests=most))

    def unschedulable(pod):
        return any(
            c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or []
        )

    for name in ("huge", "next"):
        pod = wait_for_pod(core, ns, name, unschedulable, "unschedulable")
        condition = next(c for c in pod.status.conditions if c.type == "PodScheduled")
        assert condition.reason == "Unschedulable"
        assert condition.message == "0/1 nodes are available: 1 Insufficient memory."
        assert pod.status.phase == "Pending" and not pod.spec.node_name

    core.delete_namespaced_pod("hog", ns)
    pod = wait_for_pod(core, ns, "next", ended, "run once the hog is gone")
    assert pod.status.phase == "Succeeded" and pod.spec.node_name == "test-node"
    assert not core.read_namespaced_pod("huge", ns).spec.node_name


def test_a_pod_waits_for_a_secret_made_after_it(core, k8s_namespace, k8s_kubelet):
    ns = k8s_namespace
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}]
    code = "import os; print('token', os.environ['TOKEN'])"
    core.create_namespaced_pod(ns, pod_manifest("patient", code, env=env))
    config_error = waiting("CreateContainerConfigError")
    pod = wait_for_pod(core, ns, "patient", config_error, "waiting for its Secret")
    assert pod.status.container_statuses[0].state.waiting.message == 'secret "later" not found'
    assert pod.status.phase == "Pending"

    core.create_namespaced_secret(
        ns, {"metadata": {"name": "later"}, "stringData": {"token": "t0k"}}
    )
    pod = wait_for_pod(core, ns, "patient", ended, "ended")
    assert pod.status.phase == "Succeeded" and "token t0k" in k8s_kubelet.logs(ns, "patient")


def test_a_missing_image_is_a_pull_error_and_the_pod_can_still_be_deleted(
    core, k8s_namespace, k8s_kubelet
):
    ns = k8s_namespace
    image = "registry.example/no-such-image:1"
    k8s_kubelet.missing_images.add(image)  # as good as gone: the test uses no other
    core.create_namespaced_pod(ns, pod_manifest("unpulled", SLEEPER, image=image))

    pod = wait_for_pod(core, ns, "unpulled", waiting("ErrImagePull"), "ErrImagePull")
    assert (
        f"pull access denied for {image}" in pod.status.container_statuses[0].state.waiting.message
    )
    pod = wait_for_pod(core, ns, "unpulled", waiting("ImagePullBackOff"), "ImagePullBackOff")
    assert pod.status.phase == "Pending" and k8s_kubelet.pid(ns, "unpulled") is None

    core.delete_namespaced_pod("unpulled", ns)
    wait_for_pod(core, ns, "unpulled", gone, "deleted", timeout=10)


def test_stop_kills_the_processes_of_its_pods_and_their_children(
    k8s_cluster, core, k8s_namespace, k8s_kubelet
):
    # A kubelet of its own, on a node of its own (the session's kubelet ignores its pods).
    ns, kubelet = k8s_namespace, TestKubelet(k8s_cluster, node_name="stop-node").start()
    code = """
        import subprocess, time
        child = subprocess.Popen(["sleep", "600"])
        print("child", child.pid, flush=True)
        time.sleep(600)
    """
    try:
        core.create_namespaced_pod(ns, pod_manifest("parent", code, spec={"nodeName": "stop-node"}))
        child = wait_for(lambda: re.search(r"child (\d+)", kubelet.logs(ns, "parent")), "child")
        pids = [kubelet.pid(ns, "parent"), int(child[1])]
        assert all(alive(pid) for pid in pids)
    finally:
        kubelet.stop()
    wait_for(lambda: not any(alive(pid) for pid in pids), "all killed", timeout=5)
    # No kubelet serves the node now: only a deletion without grace removes the pod.
    core.delete_namespaced_pod("parent", ns, grace_period_seconds=0)


def test_pods_in_a_namespace_labelled_off_are_left_alone(
    k8s_cluster, k8s_admin_client, core, k8s_namespace, k8s_kubelet
):
    off = f"{k8s_namespace}-off"
    core.create_namespace({"metadata": {"name": off, "labels": LABEL_OFF}})
    try:
        k8s_cluster.wait_for_default_service_account(off)
        core.create_namespaced_pod(off, pod_manifest("ignored", ""))
        core.create_namespaced_pod(k8s_namespace, pod_manifest("served", ""))
        # The kubelet handles pod events in order: once the later pod ran, it has seen
        # the earlier one, and left it alone.
        wait_for_pod(core, k8s_namespace, "served", ended, "ended")
        pod = core.read_namespaced_pod("ignored", off)
        assert not pod.spec.node_name and not pod.status.conditions
    finally:
        core.delete_namespace(off)
