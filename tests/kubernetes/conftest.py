"""Fixtures for tests against a real Kubernetes API server (see cluster.py).

One cluster per test session (it takes seconds to start and ~0.5 GB of memory); tests
keep apart by working in namespaces of their own (`k8s_namespace`).
"""

from __future__ import annotations

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
    """A fresh namespace whose `default` service account has its token (so pods are
    admitted); deleted after the test, which the namespace controller then empties."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    k8s_cluster.wait_for_default_service_account(name)
    yield name
    core.delete_namespace(name)
