"""Fixtures for tests against a real Kubernetes API server (see cluster.py).

One cluster per test session (it takes seconds to start and ~0.5 GB of memory); tests
keep apart by working in namespaces of their own (`k8s_namespace`). Pods run only for
tests that use `k8s_kubelet` (kubelet.py); in the namespaces of the others they stay
unscheduled, as with no kubelet at all.
"""

from __future__ import annotations

import uuid

import pytest

from tests.integration.faults import wait_for
from tests.kubernetes.access import ensure_priority_classes, grant_rbac_yaml
from tests.kubernetes.cluster import TestCluster


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory):
    """A running etcd + kube-apiserver + kube-controller-manager. Fails (does not skip)
    when the binaries are not built, naming the command that builds them. Logs stay in
    pytest's temp dir (`.../k8s-cluster0/logs`) after the session."""
    cluster = TestCluster(workdir=tmp_path_factory.mktemp("k8s-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def k8s_kubelet(k8s_cluster):
    """The test kubelet and scheduler: pods bound to its node "test-node" run as local
    processes (see kubelet.py); all of them are killed at the end of the session. The
    pods' output is in `<k8s_cluster.workdir>/pod-logs/`."""
    from tests.kubernetes.kubelet import TestKubelet

    kubelet = TestKubelet(k8s_cluster).start()
    yield kubelet
    kubelet.stop()


def _api_client(kubeconfig):
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


@pytest.fixture(scope="session")
def k8s_admin_client(k8s_cluster):
    """A `kubernetes.client.ApiClient` as the cluster admin (system:masters)."""
    with _api_client(k8s_cluster.admin_kubeconfig) as client:
        yield client


@pytest.fixture(scope="session")
def k8s_user_client(k8s_cluster):
    """A `kubernetes.client.ApiClient` as a user without any RBAC binding."""
    with _api_client(k8s_cluster.user_kubeconfig) as client:
        yield client


@pytest.fixture
def k8s_namespace(request, k8s_cluster, k8s_admin_client):
    """A fresh namespace whose `default` service account has its token (so pods are
    admitted); deleted after the test, which the namespace controller then empties.
    Unless the test uses `k8s_kubelet`, the kubelet leaves the namespace's pods alone
    (the kubelet may be running for other tests)."""
    from kubernetes import client

    from tests.kubernetes.kubelet import LABEL_OFF

    core = client.CoreV1Api(k8s_admin_client)
    name = f"t-{uuid.uuid4().hex[:8]}"
    labels = None if "k8s_kubelet" in request.fixturenames else LABEL_OFF
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    k8s_cluster.wait_for_default_service_account(name)
    yield name
    core.delete_namespace(name)


@pytest.fixture
def job_namespace(k8s_cluster, k8s_admin_client, k8s_namespace, k8s_kubelet):
    """A namespace set up as the README tells an admin to: deploy/rbac.yaml applied, its
    user Role bound to the notebook's user, and the priority classes."""
    from kubernetes import client

    ensure_priority_classes(k8s_admin_client)
    grant_rbac_yaml(k8s_admin_client, k8s_namespace, k8s_cluster.user_name)
    core = client.CoreV1Api(k8s_admin_client)

    def master_account_has_its_token():
        account = core.read_namespaced_service_account("elasticdl-nb-master", k8s_namespace)
        return bool(account.secrets)

    wait_for(master_account_has_its_token, 30, "the master service account's token")
    return k8s_namespace


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the real node (test_real_node.py) shows the node's logs: the
    ends and last errors of kubelet, containerd, kube-proxy and kube-scheduler."""
    outcome = yield
    report = outcome.get_result()
    node = getattr(item, "funcargs", {}).get("real_node")
    if report.failed and node is not None:
        report.sections.append(("real node logs", node.tails()))
