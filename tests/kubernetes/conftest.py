"""Fixtures for tests against a real Kubernetes API server (see cluster.py).

Two clusters per test session, each started once, shared by the tests that need it;
tests keep apart by working in namespaces of their own:
- `k8s_cluster`: an API server, etcd and controller manager with no node. Pods are
  stored, never run: for what the API server alone decides (RBAC, quotas, watches).
- `real_node`: a second cluster with a real node beside it (node.py: containerd + runc,
  kubelet, kube-scheduler, kube-proxy) that runs pods in containers of the job image
  `make test-node` builds. Every test that runs a job's pods uses it (`job_namespace`).
  Only one can run on a machine at a time (fixed names and addresses): a second
  session waits for the first one's node (node.MACHINE_LOCK).
"""

from __future__ import annotations

import time
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
def k8s_namespace(k8s_cluster, k8s_admin_client):
    """A fresh namespace on the session's cluster (no node: its pods are stored, never
    run) whose `default` service account has its token; deleted after the test."""
    yield from _namespace(k8s_cluster, k8s_admin_client)


def _namespace(cluster, admin):
    from kubernetes import client

    core = client.CoreV1Api(admin)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    cluster.wait_for_default_service_account(name)
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory):
    """A second TestCluster, configured for a real node, and the RealNode on it. At the
    end both stop, and the machine must be as before (`leftovers()`). After a run killed
    without its teardown, `python -m tests.kubernetes.node --clean` undoes the node."""
    from tests.kubernetes.node import RealNode

    logs = tmp_path_factory.mktemp("real-node-logs")
    node = RealNode(logs=logs).prepare()
    cluster = TestCluster(workdir=tmp_path_factory.mktemp("real-cluster"), **node.cluster_options())
    try:
        cluster.start()
        node.start(cluster)
    except BaseException:
        node.stop()
        node.release()
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
    node.release()  # after the check: another session's node may start now
    assert not problems and not left, f"not undone: {problems}; left on the machine: {left}"


@pytest.fixture(scope="session")
def real_cluster(real_node):
    """The TestCluster the real node belongs to."""
    return real_node.cluster


@pytest.fixture(scope="session")
def real_admin(real_cluster):
    """A `kubernetes.client.ApiClient` as the real node's cluster admin."""
    with _api_client(real_cluster.admin_kubeconfig) as client:
        yield client


@pytest.fixture
def real_namespace(real_cluster, real_admin):
    """A fresh namespace on the real node's cluster, deleted after the test."""
    yield from _namespace(real_cluster, real_admin)


@pytest.fixture
def job_namespace(real_cluster, real_admin, real_namespace):
    """A namespace on the real node's cluster set up as the README tells an admin to:
    deploy/rbac.yaml applied, its user Role bound to the notebook's user, and the
    priority classes. The notebook side (the tests) then acts as that user only."""
    from kubernetes import client

    ensure_priority_classes(real_admin)
    grant_rbac_yaml(real_admin, real_namespace, real_cluster.user_name)
    core = client.CoreV1Api(real_admin)

    def master_account_has_its_token():
        account = core.read_namespaced_service_account("elasticdl-nb-master", real_namespace)
        return bool(account.secrets)

    wait_for(master_account_has_its_token, 30, "the master service account's token")
    return real_namespace


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the real node shows the node's logs: the
    ends and last errors of kubelet, containerd, kube-proxy and kube-scheduler."""
    outcome = yield
    report = outcome.get_result()
    node = getattr(item, "funcargs", {}).get("real_node")
    if report.failed and node is not None:
        report.sections.append(("real node logs", node.tails()))
