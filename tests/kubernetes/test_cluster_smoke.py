"""Smoke tests of the test Kubernetes cluster itself, with the official Python client:
what later tests of the Kubernetes backend rely on actually works here."""

from __future__ import annotations

import base64
import time

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


def pod_manifest(name: str) -> client.V1Pod:
    # nodeName is set as a scheduler would; no kubelet runs, so the pod stays Pending.
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "smoke"}),
        spec=client.V1PodSpec(
            node_name="node-1",
            containers=[client.V1Container(name="main", image="busybox")],
        ),
    )


def test_namespace_exists(k8s_admin_client, k8s_namespace):
    ns = client.CoreV1Api(k8s_admin_client).read_namespace(k8s_namespace)
    assert ns.status.phase == "Active"


def test_pod_list_and_watch_from_resource_version(k8s_admin_client, k8s_namespace):
    core = client.CoreV1Api(k8s_admin_client)
    start = core.list_namespaced_pod(k8s_namespace).metadata.resource_version

    core.create_namespaced_pod(k8s_namespace, pod_manifest("p1"))
    assert [p.metadata.name for p in core.list_namespaced_pod(k8s_namespace).items] == ["p1"]
    core.patch_namespaced_pod("p1", k8s_namespace, {"metadata": {"labels": {"step": "2"}}})
    # Without a kubelet only grace period 0 removes a pod bound to a node at once.
    core.delete_namespaced_pod("p1", k8s_namespace, grace_period_seconds=0)

    events = []
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod, k8s_namespace, resource_version=start, timeout_seconds=20
    ):
        events.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    assert events[0] == ("ADDED", "p1")
    assert ("MODIFIED", "p1") in events
    assert events[-1] == ("DELETED", "p1")


def test_owner_reference_garbage_collection(k8s_admin_client, k8s_namespace):
    core = client.CoreV1Api(k8s_admin_client)
    pod = core.create_namespaced_pod(k8s_namespace, pod_manifest("owner"))
    owner = client.V1OwnerReference(
        api_version="v1", kind="Pod", name="owner", uid=pod.metadata.uid
    )
    core.create_namespaced_config_map(
        k8s_namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="owned", owner_references=[owner]),
            data={"k": "v"},
        ),
    )

    core.delete_namespaced_pod("owner", k8s_namespace, grace_period_seconds=0)

    # The controller-manager's garbage collector deletes the dependent.
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_config_map("owned", k8s_namespace)
        except ApiException as err:
            assert err.status == 404
            break
        assert time.monotonic() < deadline, "ConfigMap not garbage-collected in 30 s"
        time.sleep(0.5)


def test_unprivileged_user_is_forbidden(k8s_user_client, k8s_namespace):
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(k8s_user_client).list_namespaced_pod(k8s_namespace)
    assert err.value.status == 403


def test_service_account_token_is_minted_and_authenticates(
    k8s_cluster, k8s_admin_client, k8s_namespace
):
    core = client.CoreV1Api(k8s_admin_client)
    account = core.read_namespaced_service_account("default", k8s_namespace)
    secret = core.read_namespaced_secret(account.secrets[0].name, k8s_namespace)
    assert secret.type == "kubernetes.io/service-account-token"
    assert {"token", "ca.crt", "namespace"} <= set(secret.data)

    # The token is accepted: the API server knows who it is, and RBAC (no bindings)
    # refuses it.
    token = base64.b64decode(secret.data["token"]).decode()
    status, body = k8s_cluster.request(f"/api/v1/namespaces/{k8s_namespace}/pods", token)
    assert status == 403
    assert f"system:serviceaccount:{k8s_namespace}:default" in body["message"]


def test_errors_are_422_and_409(k8s_admin_client, k8s_namespace):
    core = client.CoreV1Api(k8s_admin_client)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(k8s_namespace, pod_manifest("Bad_Name"))
    assert err.value.status == 422
    core.create_namespaced_pod(k8s_namespace, pod_manifest("dup"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(k8s_namespace, pod_manifest("dup"))
    assert err.value.status == 409


def test_service_delete_with_raw_response(k8s_admin_client, k8s_namespace):
    """The typed `delete_namespaced_service` of recent clients cannot parse what a 1.20
    server returns (see the cluster's notes); asking for the raw response works."""
    core = client.CoreV1Api(k8s_admin_client)
    core.create_namespaced_service(
        k8s_namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="svc"),
            spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=80)]),
        ),
    )
    resp = core.delete_namespaced_service("svc", k8s_namespace, _preload_content=False)
    assert resp.status == 200
    with pytest.raises(ApiException) as err:
        core.read_namespaced_service("svc", k8s_namespace)
    assert err.value.status == 404
