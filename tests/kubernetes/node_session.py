"""A real node and its cluster for one run, and namespaces on it set up as a cluster admin
would: what the `real_node`/`job_namespace` fixtures do, for code outside pytest too
(bench/kubernetes.py).

The real node is a machine-wide singleton (fixed bridge, addresses and names), so whoever
runs one holds `LOCK` (flock) for as long as it runs. `NodeSession.start()` takes it and
`stop()` lets it go. Run under `flock /tmp/edl-real-node.lock <command>`, a process
inherits the lock's descriptor and the lock is found already held (locking it again
through that descriptor succeeds at once), as it is when an ancestor holds it (`flock
LOCK make bench`, whose commands' children do not get the descriptor); otherwise it waits
for the lock.

    session = NodeSession(workdir).start()        # lock, cluster, node (Ready)
    try:
        namespace = session.job_namespace()       # deploy/rbac.yaml, priority classes
        ...                                       # act as session.cluster.user_kubeconfig
    finally:
        undone = session.stop()                   # node, cluster, lock; what is left
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.kubernetes.cluster import BINARIES, TestCluster, binaries_dir
from tests.kubernetes.cluster import BUILD_COMMAND as CLUSTER_BUILD_COMMAND
from tests.kubernetes.node import (
    BUILD_COMMAND,
    NODE_BINARIES,
    NodeImagesMissing,
    NodeStartError,
    RealNode,
    node_images,
)

LOCK = Path("/tmp/edl-real-node.lock")


def unavailable() -> str:
    """Why a real node cannot start on this machine ('' when it can): not root, or the
    programs and images that `make test-cluster` and `make test-node` build are missing."""
    if os.geteuid() != 0:
        return "needs root (containerd, the kubelet, iptables, cgroups)"
    bin_dir = binaries_dir()
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        return f"cluster programs missing ({', '.join(missing)}): {CLUSTER_BUILD_COMMAND}"
    missing = [b for b in NODE_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    missing += [b for b in ("containerd", "ctr", "runc") if not shutil.which(b)]
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


class NodeLock:
    """`LOCK`, held exclusively: through a descriptor this process inherited (a command
    run under `flock LOCK ...`), or through one of its own, waited for."""

    def __init__(self, path: Path = LOCK):
        self.path = path
        self._own_fd: int | None = None
        self.inherited = False

    def acquire(self, timeout: float | None = None, on_wait: Callable[[str], None] = print):
        if self._inherited_fd() is not None or self._held_by_ancestor():
            self.inherited = True
            return self
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    os.close(fd)
                    raise TimeoutError(
                        f"{self.path} still held by another run after {timeout} s"
                    ) from None
                if not told:
                    on_wait(f"waiting for {self.path}: another run has a real node")
                    told = True
                time.sleep(1.0)
        self._own_fd = fd
        return self

    def release(self) -> None:
        if self._own_fd is not None:  # an inherited one is its holder's to let go
            fcntl.flock(self._own_fd, fcntl.LOCK_UN)
            os.close(self._own_fd)
            self._own_fd = None

    def _held_by_ancestor(self) -> int | None:
        """The process that holds the lock, if it is this one's parent or further up
        (`flock LOCK make bench`: the descriptor was not passed down to this process)."""
        try:
            inode = os.stat(self.path).st_ino
            table = Path("/proc/locks").read_text().splitlines()
        except OSError:
            return None
        holders = set()
        for line in table:
            fields = line.split()
            if (
                len(fields) > 5
                and fields[1] == "FLOCK"
                and fields[5].rsplit(":", 1)[-1] == str(inode)
            ):
                holders.add(int(fields[4]))
        pid = os.getppid()
        while pid > 1:
            if pid in holders:
                return pid
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return None
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        return None

    def _inherited_fd(self) -> int | None:
        """An open descriptor of this process on the lock file through which the lock
        is (or can at once be) held."""
        target = str(self.path.resolve())
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                if os.readlink(f"/proc/self/fd/{name}") != target:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError:
                continue
        return None


class NodeSession:
    """A TestCluster configured for a real node, and the RealNode on it (the conftest's
    `real_node` fixture, outside pytest). After `start()`: `node`, `cluster`, `admin`
    (a `kubernetes.client.ApiClient` as the cluster admin), `seconds` (start-up)."""

    def __init__(self, workdir: Path | str, logs: Path | str | None = None):
        self.workdir = Path(workdir)
        self.logs = Path(logs) if logs else self.workdir / "node-logs"
        self.lock = NodeLock()
        self.node: RealNode | None = None
        self.cluster: TestCluster | None = None
        self.admin = None
        self.seconds: dict[str, float] = {}

    def start(
        self,
        lock_timeout: float | None = 3600,
        busy_timeout: float = 600,
        on_wait: Callable[[str], None] = print,
    ) -> NodeSession:
        """Take the lock, start the cluster and the node. A machine still busy with a
        node (one started without the lock, or a killed run's leftovers) is waited for
        up to `busy_timeout` seconds, then NodeStartError."""
        t0 = time.monotonic()
        self.lock.acquire(lock_timeout, on_wait)
        self.seconds["lock"] = time.monotonic() - t0
        try:
            self._start(t0 + self.seconds["lock"] + busy_timeout, on_wait)
        except BaseException:
            self.lock.release()
            raise
        self.seconds["total"] = time.monotonic() - t0
        return self

    def _start(self, busy_deadline: float, on_wait: Callable[[str], None]) -> None:
        from kubernetes import config

        self.logs.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                self.node = RealNode(logs=self.logs).prepare()
                break
            except NodeStartError as exc:
                if "not free" not in str(exc) or time.monotonic() > busy_deadline:
                    raise
                on_wait(f"the machine is busy with another real node; waiting: {exc}")
                time.sleep(10)
        self.cluster = TestCluster(workdir=self.workdir / "cluster", **self.node.cluster_options())
        try:
            self.cluster.start()
            self.node.start(self.cluster)
        except BaseException:
            self.node.stop()
            self.cluster.stop(keep_workdir=True)
            raise
        self.seconds.update(cluster=self.cluster.start_seconds, **self.node.timings)
        self.admin = config.new_client_from_config(config_file=str(self.cluster.admin_kubeconfig))

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
        """Stop the node and the cluster, let the lock go; returns what was not undone
        or is left on the machine (empty when it is as before)."""
        undone: list[str] = []
        try:
            if self.admin is not None:
                with contextlib.suppress(Exception):
                    self.admin.close()
            if self.node is not None:
                undone += self.node.stop()
            if self.cluster is not None:
                self.cluster.stop()
            if self.node is not None:
                undone += [f"left: {x}" for x in self.node.leftovers()]
        finally:
            self.lock.release()
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
