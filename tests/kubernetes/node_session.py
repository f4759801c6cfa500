"""A real node and its cluster for one run, and namespaces on it set up as a cluster admin
would: what the `real_node` and `job_namespace` fixtures do, for code outside pytest too
(bench/kubernetes_node.py).

The real node is a machine-wide singleton (fixed bridge, addresses and names):
`RealNode.prepare()` waits for node.MACHINE_LOCK, which another session's node holds
until that session lets it go (`NodeSession.stop()` does, after its checks).

    session = NodeSession(workdir).start()        # cluster, node (Ready)
    try:
        namespace = session.job_namespace()       # deploy/rbac.yaml, priority classes
        ...                                       # act as session.cluster.user_kubeconfig
    finally:
        undone = session.stop()                   # node, cluster; what is left
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

from tests.kubernetes.cluster import BINARIES, TestCluster, binaries_dir
from tests.kubernetes.cluster import BUILD_COMMAND as CLUSTER_BUILD_COMMAND
from tests.kubernetes.node import (
    BUILD_COMMAND,
    NodeImagesMissing,
    RealNode,
    missing_programs,
    node_images,
)


def unavailable() -> str:
    """Why a real node cannot start on this machine ('' when it can): not root, or the
    programs and images that `make test-cluster` and `make test-node` build are missing."""
    if os.geteuid() != 0:
        return "needs root (containerd, the kubelet, iptables, cgroups)"
    bin_dir = binaries_dir()
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        return f"cluster programs missing ({', '.join(missing)}): {CLUSTER_BUILD_COMMAND}"
    missing = missing_programs(bin_dir)
    if missing:
        return f"node programs missing ({', '.join(missing)}): {BUILD_COMMAND}"
    try:
        images = node_images()
    except NodeImagesMissing as exc:
        return str(exc)
    gone = [v for k, v in images.items() if k.endswith("_ARCHIVE") and not Path(v).exists()]
    if gone:
        return f"node image archives missing ({', '.join(gone)}): {BUILD_COMMAND}"
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the `kubernetes` Python package is not installed"
    return ""


class NodeSession:
    """A TestCluster configured for a real node, and the RealNode on it (the conftest's
    `real_node` fixture, outside pytest). After `start()`: `node`, `cluster`, `admin`
    (a `kubernetes.client.ApiClient` as the cluster admin), `seconds` (start-up)."""

    def __init__(
        self, workdir: Path | str, logs: Path | str | None = None, reserved_cpu_m: int = 0
    ):
        self.workdir = Path(workdir)
        self.reserved_cpu_m = reserved_cpu_m  # (RealNode's: CPU pods cannot request)
        self.logs = Path(logs) if logs else self.workdir / "node-logs"
        self.node: RealNode | None = None
        self.cluster: TestCluster | None = None
        self.admin = None
        self.seconds: dict[str, float] = {}

    def start(self) -> NodeSession:
        """Start the cluster and the node (once another session's node, if any, has
        stopped); `seconds` says how long each part took."""
        from kubernetes import config

        t0 = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        # (prepare() waits for node.MACHINE_LOCK)
        self.node = RealNode(logs=self.logs, reserved_cpu_m=self.reserved_cpu_m).prepare()
        self.seconds["lock"] = time.monotonic() - t0
        self.cluster = TestCluster(workdir=self.workdir / "cluster", **self.node.cluster_options())
        try:
            self.cluster.start()
            self.node.start(self.cluster)
        except BaseException:
            self.node.stop()
            self.node.release()
            self.cluster.stop(keep_workdir=True)
            raise
        self.seconds.update(cluster=self.cluster.start_seconds, **self.node.timings)
        self.seconds["total"] = time.monotonic() - t0
        self.admin = config.new_client_from_config(config_file=str(self.cluster.admin_kubeconfig))
        return self

    def namespace(self) -> str:
        """A fresh namespace whose `default` service account has its token (the
        conftest's `real_namespace`)."""
        from kubernetes import client

        name = f"t-{uuid.uuid4().hex[:8]}"
        client.CoreV1Api(self.admin).create_namespace({"metadata": {"name": name}})
        self.cluster.wait_for_default_service_account(name)
        return name

    def job_namespace(self) -> str:
        """A fresh namespace set up as the README tells an admin to (the conftest's
        `job_namespace`): deploy/rbac.yaml applied, its user Role bound to the cluster's
        unprivileged user (`cluster.user_kubeconfig`), the priority classes; once the
        master's service account has its token."""
        namespace = self.namespace()
        set_up_for_jobs(self.cluster, self.admin, namespace)
        return namespace

    def stop(self) -> list[str]:
        """Stop the node and the cluster; returns what was not undone or is left on the
        machine (empty when it is as before). Then another session's node may start."""
        undone: list[str] = []
        if self.admin is not None:
            with contextlib.suppress(Exception):
                self.admin.close()
        if self.node is None:
            return undone
        try:
            undone += self.node.stop()
            if self.cluster is not None:
                self.cluster.stop()
            undone += [f"left: {x}" for x in self.node.leftovers()]
        finally:
            self.node.release()
        return undone


def set_up_for_jobs(cluster, admin, namespace: str) -> None:
    """What an admin does for a namespace where the notebook's user runs jobs:
    deploy/rbac.yaml, its user Role bound to `cluster.user_name`, the priority classes;
    returns once the master's service account has its token."""
    from kubernetes import client

    from tests.integration.faults import wait_for
    from tests.kubernetes.access import ensure_priority_classes, grant_rbac_yaml

    ensure_priority_classes(admin)
    grant_rbac_yaml(admin, namespace, cluster.user_name)
    core = client.CoreV1Api(admin)

    def master_account_has_its_token():
        account = core.read_namespaced_service_account("elasticdl-nb-master", namespace)
        return bool(account.secrets)

    wait_for(master_account_has_its_token, 30, "the master service account's token")
