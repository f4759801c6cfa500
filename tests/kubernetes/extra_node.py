"""More real nodes beside the first (issue 35): node N is a kubelet and a containerd of
its own on this machine, registered with the same API server, and can be lost the way a
VM is.

What keeps two kubelets and two containerds on one machine apart (FACTS.md, "Two real
nodes on one machine"):
- an address on `lo` (10.245.0.N+1), a bridge `edlnbN` with the pods' gateway, pod subnet
  10.244.N.0/24. Every bridge is in the host's network namespace, so the host routes
  between the nodes' pods itself; every node's CNI config routes 10.244.0.0/16 to its
  bridge, and the first node's kube-proxy serves them all (`--cluster-cidr`).
- a cgroup root `/edlnbN` (made in every hierarchy before the kubelet starts, cpuset
  copied from the parent): otherwise each kubelet removes the other's pod cgroups as
  orphans.
- a private mount namespace for the containerd and the kubelet, where the paths the
  kubelet hard-codes (/var/log/pods, /var/log/containers, /var/lib/kubelet/device-plugins
  and pod-resources) are the node's own dirs: otherwise a kubelet's log GC deletes the
  other's pod logs, and its device manager empties the other's plugin dir. The
  containers' mounts stay in that namespace and go with it.
- its own token (`system:node:real-node-N+1`), which the cluster must know from its start.

The first node (node.py's `RealNode`) holds the machine lock, runs the cluster-wide
kube-scheduler and kube-proxy, and undoes what every node changes on the machine
(sysctls, iptables chains, host paths): extra nodes start after it and stop before it.

`lose()` ends a node as a VM dies: its kubelet, containerd, shims and containers are
SIGKILLed at once, nothing is told to the API server. `stop()` then removes what is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import secrets
import shlex
from pathlib import Path

from tests.kubernetes.node import (
    CGROUP_ROOT,
    HOST_PATHS,
    MACHINE_LOCK,
    NodeStartError,
    RealNode,
    _cgroup_pids,
    _kill,
    _mounts,
    _pids,
    _proc_cmdline,
    _read,
    _run,
    missing_programs,
)

BUILD_COMMAND = "make test-node"
# The paths a kubelet hard-codes that another kubelet on the machine would change.
PRIVATE_PATHS = (
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
)


def node_name(index: int) -> str:
    return f"real-node-{index + 1}"


class ExtraNode(RealNode):
    """Node `index` (1, 2, ...) beside the first: see the module's docstring. Made with
    the `token` the cluster was started with (`NodeSession` makes them)."""

    def __init__(self, index: int, token: str | None = None, logs: Path | str | None = None):
        if index < 1:
            raise ValueError("node 0 is the first node (RealNode)")
        super().__init__(logs=logs, name=node_name(index), ip=f"10.245.0.{index + 1}")
        self.index = index
        self.token = token or secrets.token_hex(16)
        self.bridge = f"edlnb{index}"
        self.pod_subnet = f"10.244.{index}.0/24"
        self.pod_gateway = f"10.244.{index}.1"
        self.cgroup = f"edlnb{index}"
        self.lost = False

    # --- prepare() and start(): what differs from the first node -------------------------

    def _take_machine_lock(self) -> None:
        """The first node holds the machine lock for every node: it must run already."""
        MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(MACHINE_LOCK, "w") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # held: by the first node (of this session, the caller's to know)
            fcntl.flock(probe, fcntl.LOCK_UN)
        raise NodeStartError(f"{self.name} needs the first node running (it holds the lock)")

    def _check(self) -> None:
        missing = missing_programs(self.bin_dir)
        if missing:
            raise NodeStartError(f"real-node programs missing: {', '.join(missing)}")
        busy = self.leftovers()
        if busy:
            raise NodeStartError(
                f"the machine is not free for {self.name}: {'; '.join(busy)}. "
                "`python -m tests.kubernetes.node --clean` removes a killed run's."
            )

    def _state_before(self) -> dict:
        # The host paths are the first node's to remove: listed as there before, stop()
        # leaves them (and /var/lib/kubelet's mounts) alone.
        return {"index": self.index, "paths": list(HOST_PATHS), "sysctls": {}}

    def _claim_host(self) -> None:
        """The node's cgroup root in every v1 hierarchy (cpuset needs its cpus and mems
        before a child can be made)."""
        for controller in _hierarchies(unified=False):
            mine = controller / self.cgroup
            mine.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (controller / name).exists():
                    (mine / name).write_text(_read(controller / name) or "")
        self._added.append("cgroups")

    def _start_cluster_services(self) -> None:
        """Nothing: the first node runs the scheduler and kube-proxy for all."""

    def _kubelet_placement(self) -> list[str]:
        return [f"--cgroup-root=/{self.cgroup}", f"--pod-cidr={self.pod_subnet}"]

    def _command(self, name: str, argv: list[str]) -> list[str]:
        if name == "containerd":
            own = self.dir / "private"
            binds = []
            for path in PRIVATE_PATHS:
                source = own / Path(path).name
                source.mkdir(parents=True, exist_ok=True)
                binds.append(f"mkdir -p {path} && mount --bind {source} {path}")
            script = " && ".join(binds) + ' && exec "$@"'
            return ["unshare", "--mount", "--propagation", "private", "--"] + [
                "sh", "-c", script, "sh", *argv
            ]  # fmt: skip
        if name == "kubelet":  # into containerd's mount namespace (it exec'd: same pid)
            return ["nsenter", "-t", str(self.procs["containerd"].pid), "-m", "--", *argv]
        return argv

    # --- losing it --------------------------------------------------------------------

    def lose(self) -> None:
        """End the node as a VM dies: its kubelet, containerd, shims and containers
        SIGKILLed together; the API server hears nothing. Its Node goes NotReady when the
        cluster's grace period passes (cluster.py)."""
        for _ in range(50):
            pids = {p.pid for p in self.procs.values() if p.poll() is None}
            pids |= self._node_pids()
            if not pids:
                break
            _kill(pids)
            for proc in self.procs.values():
                with contextlib.suppress(Exception):
                    proc.wait(timeout=0.1)
        else:
            raise RuntimeError(f"{self.name}: processes stay after SIGKILL: {sorted(pids)}")
        self.procs.clear()
        self.lost = True

    def _node_pids(self) -> set[int]:
        """The node's processes: in its cgroups (the containers) or naming its dir or
        its containerd's socket (kubelet, containerd, shims)."""
        pids = set()
        for top in self._cgroup_dirs():
            pids |= _cgroup_pids(top)
        mine = (str(self.dir), str(self.socket))
        for pid in _pids():
            cmd = _proc_cmdline(pid)
            if any(m in arg for arg in cmd for m in mine):
                pids.add(pid)
        return pids

    # --- undoing ------------------------------------------------------------------------

    def _undo_machine_wide(self, step) -> None:
        """Nothing: the first node's stop undoes what all nodes changed."""

    def _cgroup_dirs(self) -> list[Path]:
        return [c / self.cgroup for c in _hierarchies(unified=True) if (c / self.cgroup).is_dir()]

    def leftovers(self) -> list[str]:
        out = []
        if self.dir is not None:
            out += [f"process {p}: {' '.join(_proc_cmdline(p))[:120]}" for p in self._node_pids()]
            out += [f"mount {m}" for m in _mounts() if m.startswith(str(self.dir))]
            if self.dir.exists():
                out.append(f"dir {self.dir}")
        if Path(f"/sys/class/net/{self.bridge}").exists():
            out.append(f"bridge {self.bridge}")
        if f"inet {self.ip}/" in _run("ip", "-4", "addr", "show", "dev", "lo").stdout:
            out.append(f"{self.ip} on lo")
        out += [f"cgroup {c}" for c in self._cgroup_dirs()]
        return out

    def __repr__(self) -> str:
        return f"ExtraNode({self.index}, {self.name}, {shlex.quote(str(self.dir))})"


def _hierarchies(unified: bool) -> list[Path]:
    """The cgroup hierarchies, each once (cpu and cpuacct are links to cpu,cpuacct)."""
    out = []
    for path in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else ():
        if path.is_symlink() or not path.is_dir() or (path.name == "unified" and not unified):
            continue
        out.append(path)
    return out
