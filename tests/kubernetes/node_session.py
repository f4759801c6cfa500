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

More nodes (extra_node.py) join the same cluster on demand and leave again:

    second, third = session.add_nodes(2)          # Ready, pods spread over three
    third.lose()                                  # as a VM dies
    session.remove_node(third)                    # what is left of it, its Node, pods
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.kubernetes.cluster import BINARIES, TestCluster, binaries_dir
from tests.kubernetes.cluster import BUILD_COMMAND as CLUSTER_BUILD_COMMAND
from tests.kubernetes.extra_node import ExtraNode, node_name
from tests.kubernetes.node import (
    BUILD_COMMAND,
    NodeImagesMissing,
    RealNode,
    missing_programs,
    node_images,
)

# Nodes beyond the first that a session can add: each has a token the cluster knows from
# its start. Each costs ~16 s to Ready, ~40 s to import the job image (2.1 GB; 4.2 GB of
# disk) and ~136 MiB + ~33 MiB per pod (FACTS.md); started together, three took 60 s.
MAX_EXTRA_NODES = 3


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
        self.extra: list[ExtraNode] = []  # the nodes add_nodes() started, not removed
        self._tokens = {i: secrets.token_hex(16) for i in range(1, MAX_EXTRA_NODES + 1)}

    def start(self) -> NodeSession:
        """Start the cluster and the node (once another session's node, if any, has
        stopped); `seconds` says how long each part took."""
        from kubernetes import config

        t0 = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        # (prepare() waits for node.MACHINE_LOCK)
        self.node = RealNode(logs=self.logs, reserved_cpu_m=self.reserved_cpu_m).prepare()
        self.seconds["lock"] = time.monotonic() - t0
        options = self.node.cluster_options()
        options["extra_tokens"] += tuple(
            (token, f"system:node:{node_name(i)}", "system:nodes")
            for i, token in self._tokens.items()
        )
        self.cluster = TestCluster(workdir=self.workdir / "cluster", **options)
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

    def add_nodes(self, count: int) -> list[ExtraNode]:
        """Start `count` more nodes (together) and return them once each is Ready and
        the controller manager has been restarted for node loss to evict (cluster.py's
        `restart_controller_manager`); `seconds["add_nodes"]` says how long it took."""
        t0 = time.monotonic()
        taken = {n.index for n in self.extra}
        free = [i for i in self._tokens if i not in taken]
        if count > len(free):
            raise ValueError(f"{count} more nodes asked, {len(free)} free of {MAX_EXTRA_NODES}")
        nodes = [ExtraNode(i, self._tokens[i], logs=self.logs / node_name(i)) for i in free[:count]]
        self.extra += nodes  # before they start: stop() undoes a half-started one too
        for node in nodes:
            node.prepare()
        with ThreadPoolExecutor(len(nodes)) as pool:
            for started in [pool.submit(n.start, self.cluster) for n in nodes]:
                started.result()
        self.cluster.restart_controller_manager()
        self.seconds["add_nodes"] = time.monotonic() - t0
        return nodes

    def remove_node(self, node: ExtraNode) -> list[str]:
        """Stop `node` (or clear what is left of a lost one), then delete its Node and
        the pods still bound to it (a lost node's stay Terminating: there is no kubelet
        to finish them and no pod GC here). Returns what was not undone."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        undone = node.stop()
        core = client.CoreV1Api(self.admin)
        bound = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.name}")
        for pod in bound.items:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                )
        with contextlib.suppress(ApiException):
            core.delete_node(node.name)
        self.extra.remove(node)
        return undone + [f"left: {x}" for x in node.leftovers()]

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
            for extra in list(self.extra):  # before the first node, which undoes the rest
                undone += self.remove_node(extra) if self.admin else extra.stop()
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
    from tests.kubernetes.access import (
        ensure_priority_classes,
        grant_rbac_yaml,
        wait_for_account_token,
    )

    ensure_priority_classes(admin)
    grant_rbac_yaml(admin, namespace, cluster.user_name)
    wait_for_account_token(admin, namespace, "elasticdl-nb-master")
