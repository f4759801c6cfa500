"""Fixtures for tests against a real Kubernetes API server (see cluster.py).

Two clusters per test session, each started once, shared by the tests that need it;
tests keep apart by working in namespaces of their own:
- `k8s_cluster`: an API server, etcd and controller manager with no node. Pods are
  stored, never run: for what the API server alone decides (RBAC, quotas, watches).
- `real_node`: a second cluster with a real node beside it (node.py: containerd + runc,
  kubelet, kube-scheduler, kube-proxy) that runs pods in containers of the job image
  `make test-node` builds. Every test that runs a job's pods uses it (`job_namespace`).
  Only one can run on a machine at a time (fixed names and addresses): a second
  session waits for the first one's node (node.MACHINE_LOCK). A module that needs more
  nodes (`four_nodes`) adds three beside it for its tests, and removes them at its end.
"""

from __future__ import annotations

import time
import uuid

import pytest

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
def real_session(tmp_path_factory):
    """A second TestCluster, configured for a real node, and the RealNode on it
    (node_session.py). At the end both stop, and the machine must be as before. After a
    run killed without its teardown, `python -m tests.kubernetes.node --clean` undoes
    the node."""
    from tests.kubernetes.node_session import NodeSession

    logs = tmp_path_factory.mktemp("real-node-logs")
    session = NodeSession(tmp_path_factory.mktemp("real-cluster"), logs=logs).start()
    print(f"\nreal node up: {session.seconds}; logs {logs}")
    yield session
    t0 = time.monotonic()
    undone = session.stop()
    print(f"\nnode and cluster stopped in {time.monotonic() - t0:.1f} s")
    assert not undone, f"not undone, or left on the machine: {undone}"


@pytest.fixture(scope="session")
def real_node(real_session):
    """The RealNode (node.py): containerd, kubelet, kube-scheduler, kube-proxy."""
    return real_session.node


@pytest.fixture(scope="session")
def real_cluster(real_session):
    """The TestCluster the real node belongs to."""
    return real_session.cluster


@pytest.fixture(scope="session")
def real_admin(real_session):
    """A `kubernetes.client.ApiClient` as the real node's cluster admin."""
    return real_session.admin


@pytest.fixture(scope="module")
def four_nodes(real_session):
    """The real node and three more (extra_node.py) for the tests of one module, each of
    which may lose one of them (`node.lose()`). At the module's end the extra nodes go,
    with their Node objects and pods: the session's other tests see one node again."""
    added = real_session.add_nodes(3)
    print(f"\nthree more nodes up in {real_session.seconds['add_nodes']:.1f} s")
    yield [real_session.node, *added]
    undone = [x for node in list(real_session.extra) for x in real_session.remove_node(node)]
    assert not undone, f"not undone, or left on the machine: {undone}"


@pytest.fixture
def real_namespace(real_cluster, real_admin):
    """A fresh namespace on the real node's cluster, deleted after the test."""
    yield from _namespace(real_cluster, real_admin)


@pytest.fixture
def job_namespace(real_cluster, real_admin, real_namespace):
    """A namespace on the real node's cluster set up as the README tells an admin to:
    deploy/rbac.yaml applied, its user Role bound to the notebook's user, and the
    priority classes. The notebook side (the tests) then acts as that user only."""
    from tests.kubernetes.node_session import set_up_for_jobs

    set_up_for_jobs(real_cluster, real_admin, real_namespace)
    return real_namespace


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the real node shows the node's logs: the
    ends and last errors of kubelet, containerd, kube-proxy and kube-scheduler."""
    outcome = yield
    report = outcome.get_result()
    session = getattr(item, "funcargs", {}).get("real_session")
    if report.failed and session is not None and session.node is not None:
        report.sections.append(("real node logs", session.node.tails()))
