"""A real Kubernetes node beside a test cluster (issue 15): pods run in containers.

`RealNode` runs, from the binaries and images that `make test-node` builds and caches:

- containerd 1.6 + runc (Debian's), with its own config, root, state and socket in a
  temp dir: `restrict_oom_score_adj` (root here cannot lower an oom_score_adj), the CNI
  plugins of /usr/lib/cni with a config dir of ours, the pause image as sandbox image,
  network namespaces under its state dir, and a proxy that refuses (127.0.0.1:9) for
  every registry, so a missing image fails at once instead of being pulled from afar.
  The pause and job images are imported with `ctr -n k8s.io images import`; the job
  image is also tagged as the name jobs use by default (JobSpec.image).
- a bridge of ours, `BRIDGE`, with the pods' gateway address: pods get addresses in
  POD_SUBNET, a route to the Service range only (no default route, no masquerade); the
  host routes the Service range nowhere (`unreachable`), so nothing addressed to a pod or
  a Service ever leaves this machine, and the test process, like a notebook outside the
  cluster, reaches pods through the API server (port-forward, logs).
- kubelet v1.20.2 as `system:node:<name>` (a static token in the cluster's token file),
  reached by the API server at NODE_IP, an address added to `lo`; kube-scheduler and
  kube-proxy (iptables mode) as the cluster admin.

The cluster must be started with `cluster_options()` (the API server on NODE_IP, the
Service range SERVICE_IP_RANGE, the node controllers, the node's token), after
`prepare()` has added NODE_IP. `start()` returns when the node is Ready and untainted.

`stop()` undoes everything, safe to call twice and from atexit: the processes, the
containers and their shims, mounts and network namespaces, the bridge, the `KUBE-*`
iptables chains (`kube-proxy --cleanup`, then any left, e.g. the kubelet's), the sysctls
the kubelet and kube-proxy change (saved before), the `kubepods` and `k8s.io` cgroups,
and the host paths the programs hard-code (/var/log/pods, /var/lib/kubelet,
/run/containerd, ...) when they did not exist before. `leftovers()` lists what is not
as it was.

One real node can run on a machine at a time (fixed names and addresses): `prepare()`
takes a machine-wide lock (MACHINE_LOCK) first and waits for another session's node to
stop, rather than failing; the lock goes with the process, even a killed one. More
nodes can join it (extra_node.py: `ExtraNode` is this class with its own addresses,
cgroup root and mount namespace); this first node undoes what all of them changed on
the machine, so they stop before it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.kubernetes import cluster_dns
from tests.kubernetes.cluster import binaries_dir

NODE_NAME = "real-node"
REPO = Path(__file__).resolve().parents[2]
MACHINE_LOCK = Path("/run/lock/elasticdl-nb-real-node.lock")
MACHINE_LOCK_WAIT_SECONDS = 45 * 60  # another session's whole real-node test run
NODE_IP = "10.245.0.1"  # on `lo`: the kubelet's and the API server's address
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
CLUSTER_POD_CIDR = "10.244.0.0/16"  # every node's POD_SUBNET (extra_node.py: 10.244.N.0/24)
SERVICE_IP_RANGE = "10.96.0.0/24"
BRIDGE = "edlnb0"
# How often a kubelet posts its status: the cluster (cluster.py) calls a node lost after
# 20 s without one, so a busy kubelet may miss four before it is.
NODE_STATUS_SECONDS = 4
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
BUILD_COMMAND = "make test-node  (tests/kubernetes/build_node.sh and build_node_images.sh)"
REFUSING_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, connects fail

# What the kubelet sets at start (container_manager_linux.go) and kube-proxy in iptables
# mode (route_localnet; conntrack's are left alone by its flags), and the bridge plugin
# (ip_forward): saved before, restored after.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
)
# Paths outside the node's own directory that the programs hard-code.
HOST_PATHS = (
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/kubelet",  # device-plugins/
    "/run/containerd",  # the shims' sockets (s/)
    "/var/lib/cni",  # libcni's result cache
    "/run/netns",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
    "/var/lib/dockershim",
)
CGROUPS = ("kubepods", "k8s.io")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROCESS_NAMES = (
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
    "pause",
)


def job_image_name() -> str:
    """The image a job's pods use unless told otherwise."""
    from elasticdl_nb.spec import JobSpec

    (field,) = [f for f in dataclasses.fields(JobSpec) if f.name == "image"]
    return field.default


def cri_ref(name: str) -> str:
    """An image's name as containerd's CRI knows it (docker.io/library/ for short ones)."""
    first = name.split("/")[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name if '/' in name else 'library/' + name}"
    return name


def node_images() -> dict[str, str]:
    """images.env of build_node_images.sh: PAUSE_IMAGE, PAUSE_ARCHIVE, JOB_IMAGE, ..."""
    root = os.environ.get("ELASTICDL_NB_CACHE") or str(Path.home() / ".cache" / "elasticdl-nb")
    path = Path(root) / "node-images" / "images.env"
    if not path.exists():
        raise NodeImagesMissing(f"no {path}: build the node images once with {BUILD_COMMAND}")
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def missing_programs(bin_dir: Path) -> list[str]:
    """The node's programs not there: ours (`make test-node`) and Debian's."""
    missing = [b for b in NODE_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    return missing + [b for b in ("containerd", "ctr", "runc") if not shutil.which(b)]


class NodeImagesMissing(RuntimeError):
    pass


class NodeStartError(RuntimeError):
    pass


def _run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=timeout)


def _cgroup_pids(top: Path) -> set[int]:
    """The processes in `top` and the cgroups below it. A walk that ignores a cgroup
    removed while it is read (its container ended): `Path.rglob` raises then."""
    pids: set[int] = set()
    for where, _, _ in os.walk(top):
        pids.update(int(p) for p in (_read(Path(where) / "cgroup.procs") or "").split())
    return pids


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _kill(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _mounts() -> list[str]:
    """Mount points, in mount order."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.append(point.encode().decode("unicode_escape"))  # \040 etc.
    return points


def _kube_chains(binary: str) -> dict[str, list[str]]:
    """{table: [KUBE-* chains]} of iptables or ip6tables."""
    out: dict[str, list[str]] = {}
    for table in ("filter", "nat", "mangle", "raw"):
        save = _run(f"{binary}-save", "-t", table, check=False)
        chains = [ln[1:].split()[0] for ln in save.stdout.splitlines() if ln.startswith(":KUBE-")]
        if chains:
            out[table] = chains
    return out


def _remove_kube_chains(binary: str) -> None:
    for table in ("filter", "nat", "mangle", "raw"):
        save = _run(f"{binary}-save", "-t", table, check=False).stdout.splitlines()
        chains = [ln[1:].split()[0] for ln in save if ln.startswith(":KUBE-")]
        if not chains:
            continue
        # Jumps into them from the built-in chains first, then the chains themselves.
        for line in save:
            if line.startswith("-A ") and not line.split()[1].startswith("KUBE-"):
                words = shlex.split(line)
                if any(w.startswith("KUBE-") for w in words[2:]):
                    _run(binary, "-t", table, "-D", *words[1:], check=False)
        for chain in chains:
            _run(binary, "-t", table, "-F", chain, check=False)
        for chain in chains:
            _run(binary, "-t", table, "-X", chain, check=False)


class RealNode:
    """See the module's docstring. `prepare()`, start the cluster with
    `cluster_options()`, `start(cluster)`; `stop()`. After `start()`: `name`, `ip`,
    `timings` (seconds: containerd, images, ready, total), `logs` (a dir of
    containerd.log, kubelet.log, kube-scheduler.log, kube-proxy.log)."""

    __test__ = False

    def __init__(
        self,
        logs: Path | str | None = None,
        name: str = NODE_NAME,
        ip: str = NODE_IP,
        bin_dir: Path | None = None,
        reserved_cpu_m: int = 0,
    ):
        self.name = name
        # CPU kept from pods for the kubelet, the runtime and (here, on the same two
        # cores) the control plane: allocatable = capacity - this (the benchmarks that
        # fill the node set it; the tests leave allocatable = capacity).
        self.reserved_cpu_m = reserved_cpu_m
        self.ip = ip
        self.bridge, self.pod_subnet, self.pod_gateway = BRIDGE, POD_SUBNET, POD_GATEWAY
        self.bin_dir = Path(bin_dir) if bin_dir else binaries_dir()
        self.token = secrets.token_hex(16)
        self._logs_given = Path(logs) if logs else None
        self.dir: Path | None = None  # short: unix socket paths must fit 108 bytes
        self.logs: Path | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.timings: dict[str, float] = {}
        self.images: dict[str, str] = {}
        self._before: dict | None = None
        self._import: subprocess.Popen | None = None  # ctr import of the job image
        self._added: list[str] = []  # host changes made, for stop(): lo, bridge, route
        self._lock = None  # the open MACHINE_LOCK, held from prepare() to stop()
        self._stopped = False

    # --- what the cluster needs -------------------------------------------------------

    def cluster_options(self) -> dict:
        """Keyword arguments of TestCluster for this node."""
        return dict(
            address=self.ip,
            service_ip_range=SERVICE_IP_RANGE,
            real_nodes=True,
            extra_tokens=((self.token, f"system:node:{self.name}", "system:nodes"),),
        )

    # --- lifecycle ----------------------------------------------------------------------

    def prepare(self) -> RealNode:
        """Check the machine is free, save what will change, add NODE_IP to `lo`, the
        bridge and the `unreachable` route of the Service range. Idempotent."""
        if self._before is not None:
            return self
        self._take_machine_lock()
        try:
            self._check()
        except BaseException:
            self._release_machine_lock()
            raise
        self.dir = Path(tempfile.mkdtemp(prefix="edl-node-", dir="/tmp"))
        self.logs = self._logs_given or self.dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._before = self._state_before()
        (self.dir / "before.json").write_text(json.dumps(self._before, indent=2))
        atexit.register(self.stop)
        _run("ip", "addr", "add", f"{self.ip}/32", "dev", "lo")
        self._added.append("lo")
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._added.append("bridge")
        prefix = self.pod_subnet.split("/")[1]
        _run("ip", "addr", "add", f"{self.pod_gateway}/{prefix}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        self._claim_host()
        return self

    def _state_before(self) -> dict:
        """What prepare() saves of the machine, for stop() (and clean() after a crash)."""
        return {
            "sysctls": {k: v for k in SYSCTLS if (v := _read(f"/proc/sys/{k}")) is not None},
            "paths": [p for p in HOST_PATHS if os.path.lexists(p)],
            "shim_sockets": sorted(os.listdir("/run/containerd/s"))
            if os.path.isdir("/run/containerd/s")
            else [],
        }

    def _claim_host(self) -> None:
        """The machine-wide part of prepare(): the Service range routed nowhere."""
        _run("ip", "route", "add", "unreachable", SERVICE_IP_RANGE)
        self._added.append("route")

    def start(self, cluster, timeout: float = 240) -> RealNode:
        t0 = time.monotonic()
        self.prepare()
        self.cluster = cluster
        self.images = node_images()
        try:
            self._write_cni_config()  # first: containerd loads it at start
            self._start_containerd(t0 + 30)
            self.timings["containerd"] = time.monotonic() - t0
            _run(*self._ctr("images", "import", self.images["PAUSE_ARCHIVE"]), timeout=60)
            # The job image (~2 GB) is imported while the kubelet registers.
            job_import = self._import = subprocess.Popen(
                self._ctr("images", "import", self.images["JOB_ARCHIVE"]),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            self._start_kubelet()
            self._start_cluster_services()
            self._wait_ready(t0 + timeout)
            self.timings["ready"] = time.monotonic() - t0
            out, _ = job_import.communicate(timeout=max(1, t0 + timeout - time.monotonic()))
            if job_import.returncode != 0:
                raise NodeStartError(f"ctr import of the job image failed:\n{out}")
            _run(*self._ctr("images", "tag", self.images["JOB_IMAGE"], self.job_image_ref()))
            self.timings["images"] = time.monotonic() - t0
        except BaseException as exc:
            tails = self.tails()
            self.stop()
            self.release()
            if isinstance(exc, Exception):
                raise NodeStartError(f"the real node did not start: {exc}\n{tails}") from exc
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def _start_cluster_services(self) -> None:
        """What the first node runs for the whole cluster: kube-scheduler, kube-proxy
        (one serves every node here: they share the host's network namespace) and the
        cluster DNS (cluster_dns.py). They act as the admin, with a copy of its
        kubeconfig in the node's dir: every process of the node names that dir on its
        command line, which is how `clean()` finds them after a crash."""
        admin = self.dir / "admin.kubeconfig"
        shutil.copy(self.cluster.admin_kubeconfig, admin)
        records = self.dir / "dns"
        records.mkdir()
        self._spawn("dns-records", [], argv=cluster_dns.records_argv(records, admin),
                    env={"PYTHONPATH": str(REPO)})  # fmt: skip
        self._spawn("dnsmasq", [], argv=cluster_dns.dnsmasq_argv(records, POD_GATEWAY))
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={admin}",
                "--leader-elect=false",
                "--port=0",  # no insecure serving
                "--secure-port=0",
            ],
        )
        self._spawn(
            "kube-proxy",
            [
                f"--kubeconfig={admin}",
                f"--hostname-override={self.name}",
                f"--bind-address={self.ip}",
                "--proxy-mode=iptables",
                # Every node's pods: traffic from them to a Service is not masqueraded.
                f"--cluster-cidr={CLUSTER_POD_CIDR}",
                "--healthz-port=0",  # metrics stay on 127.0.0.1:10249 (may not be off)
                # Leave the conntrack sysctls as they are.
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                "--v=2",
            ],
        )

    @classmethod
    def clean(cls) -> list[str]:
        """Undo the nodes of runs that died without stop() (SIGKILL; atexit never ran),
        from the state each saved in /tmp/edl-node-*/before.json. Returns what could not
        be undone. Refused while another session's node runs (it holds the lock)."""
        problems = []
        MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        lock = open(MACHINE_LOCK, "w")  # noqa: SIM115 - closed below, which releases it
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise NodeStartError(
                f"a real node of another session is running (it holds {MACHINE_LOCK}); "
                "nothing was cleaned"
            ) from None
        from tests.kubernetes.extra_node import ExtraNode

        saved = [
            (json.loads(p.read_text()), p.parent)
            for p in Path("/tmp").glob("edl-node-*/before.json")
        ]
        # The extra nodes first: the first node's stop undoes what all of them changed.
        for before, node_dir in sorted(saved, key=lambda b: -b[0].get("index", 0)):
            node = ExtraNode(before["index"]) if before.get("index") else cls()
            node.dir = node_dir
            node.logs = node.dir / "logs"
            node._before = before
            node._added = node._still_added()
            print(f"cleaning up after the node of {node.dir}")
            problems += node.stop()
        lock.close()
        return problems

    def _still_added(self) -> list[str]:
        """Which of prepare()'s host changes are there (for a killed run's clean())."""
        return [
            what
            for what, there in (
                ("lo", f"inet {self.ip}/" in _run("ip", "addr", "show", "dev", "lo").stdout),
                ("bridge", Path(f"/sys/class/net/{self.bridge}").exists()),
                ("route", "unreachable" in _run("ip", "route", "show", SERVICE_IP_RANGE).stdout),
            )
            if there
        ]

    def job_image_ref(self) -> str:
        """The job image's default name as containerd's CRI knows it."""
        return cri_ref(job_image_name())

    def ensure_image(self, kind: str, name: str) -> float:
        """Import image `kind` of build_node_images.sh (its `<KIND>_ARCHIVE`, e.g. the
        NOTEBOOK's, which only a few tests use) into this node's containerd under `name`,
        unless it is there already; returns the seconds it took (0 if it was)."""
        ref = cri_ref(name)
        listed = _run(*self._ctr("images", "list", "--quiet", f"name=={ref}")).stdout
        if listed.strip():
            return 0.0
        t0 = time.monotonic()
        _run(*self._ctr("images", "import", self.images[f"{kind}_ARCHIVE"]), timeout=300)
        _run(*self._ctr("images", "tag", self.images[f"{kind}_IMAGE"], ref))
        return time.monotonic() - t0

    def containers(self, namespace: str) -> list[str]:
        """The containers containerd holds for pods of `namespace` (sandboxes included),
        running or not: what the kubelet has not removed yet."""
        selector = f'labels."io.kubernetes.pod.namespace"=={namespace}'
        listed = _run(*self._ctr("containers", "list", "--quiet", selector)).stdout
        return listed.split()

    def container_pid(self, container_id: str) -> int:
        """The host pid of a container's first process (`containerd://ID` or ID, as a
        pod's container status names it): the node's containers are processes here."""
        container_id = container_id.split("://", 1)[-1]
        listed = _run(*self._ctr("tasks", "list")).stdout.splitlines()
        for line in listed[1:]:  # TASK PID STATUS
            task, pid, *_ = line.split()
            if task == container_id:
                return int(pid)
        raise LookupError(f"containerd runs no task {container_id}")

    def stop(self) -> list[str]:
        """Undo everything start() and prepare() did; returns what could not be undone
        (also printed). Safe to call again and from atexit."""
        if self._stopped or self._before is None:
            return []
        self._stopped = True
        problems: list[str] = []

        def step(what, fn, *args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # carry on: undo as much as possible
                problems.append(f"{what}: {exc}")

        if self._import is not None and self._import.poll() is None:
            self._import.kill()
            self._import.wait()
        for name in ("kubelet", "kube-proxy", "kube-scheduler", "dns-records", "dnsmasq"):
            step(f"stop {name}", self._stop_process, name)
        step("kill what names the node's dir", self._kill_naming, "kubelet", "kube-")
        step("kill the containers", self._kill_cgroup_processes)
        step("kill the shims", self._kill_shims)
        step("stop containerd", self._stop_process, "containerd")
        step("kill what names the node's dir", self._kill_naming)
        step("unmount", self._unmount)
        self._undo_machine_wide(step)
        if "bridge" in self._added:
            step("bridge", _run, "ip", "link", "del", self.bridge)
        if "lo" in self._added:
            step("lo address", _run, "ip", "addr", "del", f"{self.ip}/32", "dev", "lo")
        step("cgroups", self._remove_cgroups)
        if self._logs_given is None and self.dir is not None:
            # Keep the logs (small) beside nothing else; the rest goes.
            keep = Path(tempfile.mkdtemp(prefix="edl-node-logs-"))
            step("logs", shutil.copytree, self.logs, keep, dirs_exist_ok=True)
            self.logs = keep
        if self.dir is not None:
            step("node dir", shutil.rmtree, self.dir)
        if problems:
            print("RealNode.stop could not undo:\n  " + "\n  ".join(problems))
        return problems

    def _undo_machine_wide(self, step) -> None:
        """What the first node undoes for every node: KUBE-* chains (kube-proxy's and
        the kubelets'), the Service route, sysctls, the host paths the programs made."""
        step("kube-proxy --cleanup", self._kube_proxy_cleanup)
        for binary in ("iptables", "ip6tables"):
            step(f"{binary} KUBE-* chains", _remove_kube_chains, binary)
        if "route" in self._added:
            step("route", _run, "ip", "route", "del", "unreachable", SERVICE_IP_RANGE)
        step("sysctls", self._restore_sysctls)
        step("host paths", self._remove_host_paths)

    # --- information --------------------------------------------------------------------

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = (self.logs or Path("/nonexistent")) / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def tails(self, lines: int = 25) -> str:
        """The ends of the node's logs, and each one's last error lines: for failure
        messages."""
        parts = []
        for name in ("kubelet", "containerd", "kube-proxy", "kube-scheduler"):
            path = (self.logs or Path("/nonexistent")) / f"{name}.log"
            if not path.exists():
                continue
            text = path.read_text(errors="replace").splitlines()
            errors = [ln for ln in text if ln.startswith("E") or "level=error" in ln][-10:]
            parts.append(f"--- {name}.log: last errors\n" + "\n".join(errors))
            parts.append(f"--- {name}.log: last {lines} lines\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def leftovers(self) -> list[str]:
        """What is not as before prepare() (empty when the machine is clean)."""
        out = []
        for pid in _pids():
            cmd = _proc_cmdline(pid)
            if cmd and Path(cmd[0]).name in PROCESS_NAMES:
                out.append(f"process {pid}: {' '.join(cmd)[:120]}")
        for binary in ("iptables", "ip6tables"):
            for table, chains in _kube_chains(binary).items():
                out.append(f"{binary} -t {table}: {', '.join(chains)}")
        if Path(f"/sys/class/net/{self.bridge}").exists():
            out.append(f"bridge {self.bridge}")
        if f"inet {self.ip}/" in _run("ip", "-4", "addr", "show", "dev", "lo").stdout:
            out.append(f"{self.ip} on lo")
        if "unreachable" in _run("ip", "route", "show", SERVICE_IP_RANGE).stdout:
            out.append(f"route unreachable {SERVICE_IP_RANGE}")
        for key, value in (self._before or {}).get("sysctls", {}).items():
            now = _read(f"/proc/sys/{key}")
            if now != value:
                out.append(f"sysctl {key} = {now}, was {value}")
        for cgroup in self._cgroup_dirs():
            out.append(f"cgroup {cgroup}")
        before = set((self._before or {}).get("paths", HOST_PATHS))
        out += [f"path {p}" for p in HOST_PATHS if os.path.lexists(p) and p not in before]
        if self.dir is not None:
            out += [f"mount {m}" for m in _mounts() if m.startswith(str(self.dir))]
            if self.dir.exists():
                out.append(f"dir {self.dir}")
        return out

    # --- the processes ------------------------------------------------------------------

    def _check(self) -> None:
        missing = missing_programs(self.bin_dir)
        if missing:
            raise NodeStartError(
                f"real-node programs missing: {', '.join(missing)}. Build them once with "
                f"{BUILD_COMMAND}"
            )
        node_images()
        # Before prepare() nothing is compared with a saved state: what is listed is
        # another node's, running or left by a killed one.
        busy = [x for x in self.leftovers() if not x.startswith(("sysctl", "path ", "dir "))]
        if busy:
            raise NodeStartError(
                "the machine is not free for a real node (another one running, or the "
                "leftovers of one that was killed): " + "; ".join(busy) + ". When no other "
                "runs, `python -m tests.kubernetes.node --clean` removes a killed one's."
            )

    def _take_machine_lock(self) -> None:
        MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(MACHINE_LOCK, "w")  # noqa: SIM115 - held until stop()
        deadline = time.monotonic() + MACHINE_LOCK_WAIT_SECONDS
        told = False
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._release_machine_lock()
                    raise NodeStartError(
                        f"another real node held {MACHINE_LOCK} for "
                        f"{MACHINE_LOCK_WAIT_SECONDS / 60:.0f} min; is a test session stuck?"
                    ) from None
                if not told:
                    print(f"waiting for another session's real node ({MACHINE_LOCK})", flush=True)
                    told = True
                time.sleep(1)

    def release(self) -> None:
        """Let another session's node start: after `stop()`, once `leftovers()` has
        been checked (process exit also releases it)."""
        self._release_machine_lock()

    def _release_machine_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None

    def _ctr(self, *args: str) -> list[str]:
        return ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args]

    @property
    def socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    def _spawn(
        self, name: str, args: list[str], env: dict | None = None, argv: list[str] | None = None
    ) -> subprocess.Popen:
        """Start program `name` (of the cluster binaries, or `argv` whole), its output
        in the node's log `name`.log."""
        exe = name if name == "containerd" else str(self.bin_dir / name)
        log = open(self.logs / f"{name}.log", "wb")
        proc = subprocess.Popen(
            self._command(name, argv or [exe, *args]),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        log.close()
        self.procs[name] = proc
        return proc

    def _command(self, name: str, argv: list[str]) -> list[str]:
        """How program `name` is started (extra nodes run theirs in a mount namespace)."""
        return argv

    def _stop_process(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _start_containerd(self, deadline: float) -> None:
        d = self.dir / "containerd"
        (d / "cni").mkdir(parents=True, exist_ok=True)
        pause = self.images["PAUSE_IMAGE"]
        (d / "config.toml").write_text(
            f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / "cni"}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = "{d / "state" / "runc"}"
"""
        )
        proxy = {
            k: REFUSING_PROXY for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        }
        proc = self._spawn(
            "containerd", ["--config", str(d / "config.toml")], env={**proxy, "NO_PROXY": ""}
        )
        while _run(*self._ctr("version"), check=False, timeout=10).returncode != 0:
            if proc.poll() is not None:
                raise NodeStartError(
                    f"containerd exited with {proc.returncode}:\n{self.log_tail('containerd')}"
                )
            if time.monotonic() > deadline:
                raise NodeStartError("containerd did not answer in time")
            time.sleep(0.1)

    def _write_cni_config(self) -> None:
        conf = {
            "cniVersion": "0.4.0",
            "name": "elasticdl-nb-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,  # the bridge has the gateway address
                    "ipMasq": False,  # no NAT beyond the machine: there is no beyond
                    "hairpinMode": True,  # a pod reaches itself through its Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_subnet, "gateway": self.pod_gateway}]],
                        # Services and the other nodes' pods, and no default route.
                        "routes": [{"dst": SERVICE_IP_RANGE}, {"dst": CLUSTER_POD_CIDR}],
                        "dataDir": str(self.dir / "cni-ipam"),
                    },
                }
            ],
        }
        path = self.dir / "containerd" / "cni" / "10-elasticdl-nb.conflist"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(conf, indent=2))

    def _start_kubelet(self) -> None:
        c = self.cluster
        kubeconfig = self.dir / "kubelet.kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "node",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": c.server,
                                "certificate-authority": str(c.ca_file),
                            },
                        }
                    ],
                    "users": [{"name": "node", "user": {"token": self.token}}],
                    "contexts": [{"name": "node", "context": {"cluster": "test", "user": "node"}}],
                }
            )
        )
        kubeconfig.chmod(0o600)
        root = self.dir / "kubelet"
        (self.dir / "resolv.conf").write_text("")  # pods get no name server from afar
        self._spawn(
            "kubelet",
            [
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={root}",
                f"--seccomp-profile-root={root / 'seccomp'}",
                f"--volume-plugin-dir={self.dir / 'volume-plugins'}",
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{self.socket}",
                "--cgroup-driver=cgroupfs",
                "--fail-swap-on=false",
                "--network-plugin=cni",
                "--cni-bin-dir=/usr/lib/cni",
                f"--cni-conf-dir={self.dir / 'containerd' / 'cni'}",
                f"--pod-infra-container-image={self.images['PAUSE_IMAGE']}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                f"--address={self.ip}",
                "--healthz-port=0",
                "--read-only-port=0",
                f"--resolv-conf={self.dir / 'resolv.conf'}",
                # Every node's pods ask the first node's dnsmasq (cluster_dns.py).
                f"--cluster-dns={POD_GATEWAY}",
                f"--cluster-domain={cluster_dns.CLUSTER_DOMAIN}",
                "--image-gc-high-threshold=100",
                "--image-gc-low-threshold=99",
                "--eviction-hard=memory.available<1Mi,nodefs.available<1%,"
                "imagefs.available<1%,nodefs.inodesFree<1%",
                "--max-pods=50",
                *([f"--kube-reserved=cpu={self.reserved_cpu_m}m"] if self.reserved_cpu_m else []),
                f"--node-status-update-frequency={NODE_STATUS_SECONDS}s",
                *self._kubelet_placement(),
                "--v=2",
            ],
            # The credential lookup may otherwise ask the cloud metadata address.
            env={"AWS_EC2_METADATA_DISABLED": "true"},
        )

    def _kubelet_placement(self) -> list[str]:
        """Where the kubelet puts its pods when it is not the machine's first node."""
        return []

    def _wait_ready(self, deadline: float) -> None:
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise NodeStartError(
                        f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
                    )
            status, node = self.cluster.request(f"/api/v1/nodes/{self.name}")
            if status == 200:
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions", [])
                )
                if ready and not node.get("spec", {}).get("taints"):
                    return
            if time.monotonic() > deadline:
                raise NodeStartError(f"node {self.name} not Ready and untainted in time")
            time.sleep(0.2)

    # --- undoing ------------------------------------------------------------------------

    def _cgroup_dirs(self) -> list[Path]:
        out = []
        for controller in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else ():
            for name in CGROUPS:
                if (controller / name).is_dir():
                    out.append(controller / name)
        return out

    def _kill_cgroup_processes(self) -> None:
        """Every process in the pods' cgroups: the containers (their shims may be gone)."""
        for _ in range(50):
            pids = set()
            for top in self._cgroup_dirs():
                pids |= _cgroup_pids(top)
            if not pids:
                return
            _kill(pids)
            time.sleep(0.1)
        raise RuntimeError(f"processes stay in the pods' cgroups: {sorted(pids)}")

    def _kill_naming(self, *names: str) -> None:
        """SIGKILL the processes (whose program starts with one of `names`, if given)
        with the node's dir on their command line: what a crashed run left."""
        mine = str(self.dir)
        for _ in range(50):
            pids = [
                p
                for p in _pids()
                if p != os.getpid()
                and (cmd := _proc_cmdline(p))
                and any(mine in a for a in cmd)
                and (not names or Path(cmd[0]).name.startswith(names))
            ]
            if not pids:
                return
            _kill(pids)
            time.sleep(0.1)
        raise RuntimeError(f"processes stay: {pids}")

    def _kill_shims(self) -> None:
        sock = str(self.socket)
        for _ in range(50):
            shims = [p for p in _pids() if sock in _proc_cmdline(p)]
            if not shims:
                return
            _kill(shims)
            time.sleep(0.1)
        raise RuntimeError(f"shims stay: {shims}")

    def _unmount(self) -> None:
        """What the node mounted: all under its dir (rootfs overlays, shm, network
        namespaces, volumes), and under /var/lib/kubelet if that is new."""
        roots = [str(self.dir)]
        if "/var/lib/kubelet" not in self._before["paths"]:
            roots.append("/var/lib/kubelet")
        for _ in range(3):
            points = [m for m in _mounts() if any(m == r or m.startswith(r + "/") for r in roots)]
            if not points:
                return
            for point in reversed(points):
                if _run("umount", point, check=False).returncode != 0:
                    _run("umount", "-l", point, check=False)
        left = [m for m in _mounts() if any(m.startswith(r) for r in roots)]
        if left:
            raise RuntimeError(f"still mounted: {left}")

    def _kube_proxy_cleanup(self) -> None:
        if not os.access(self.bin_dir / "kube-proxy", os.X_OK):
            return
        done = _run(str(self.bin_dir / "kube-proxy"), "--cleanup", check=False)
        if self.logs is not None:
            (self.logs / "kube-proxy-cleanup.log").write_text(done.stdout + done.stderr)

    def _restore_sysctls(self) -> None:
        failed = []
        for key, value in self._before["sysctls"].items():
            if _read(f"/proc/sys/{key}") != value:
                try:
                    Path(f"/proc/sys/{key}").write_text(value)
                except OSError as exc:
                    failed.append(f"{key}={value}: {exc}")
        if failed:
            raise RuntimeError(", ".join(failed))

    def _remove_cgroups(self) -> None:
        for top in self._cgroup_dirs():
            dirs = [Path(where) for where, _, _ in os.walk(top, topdown=False)]  # deepest first
            for d in dirs:
                with contextlib.suppress(FileNotFoundError):
                    d.rmdir()

    def _remove_host_paths(self) -> None:
        for path in HOST_PATHS:
            if path in self._before["paths"]:
                if path == "/run/containerd" and os.path.isdir("/run/containerd/s"):
                    # Only the shims' sockets made since.
                    for s in set(os.listdir("/run/containerd/s")) - set(
                        self._before["shim_sockets"]
                    ):
                        with contextlib.suppress(OSError):
                            os.unlink(f"/run/containerd/s/{s}")
                continue
            if os.path.islink(path) or os.path.isfile(path):
                os.unlink(path)
            elif os.path.isdir(path):
                shutil.rmtree(path)


def main() -> None:
    """`python -m tests.kubernetes.node [--hold]`: start a cluster and a node, print the
    timings, (with --hold: wait for Ctrl-C, printing the admin kubeconfig), stop both and
    print what is left on the machine. `--clean`: undo the nodes of killed runs."""
    import sys

    from tests.kubernetes.cluster import TestCluster

    if "--clean" in sys.argv:
        problems = RealNode.clean()
        left = RealNode().leftovers()
        print(f"not undone: {problems}; left: {left}")
        sys.exit(1 if problems or left else 0)

    node = RealNode().prepare()
    cluster = TestCluster(**node.cluster_options())
    try:
        cluster.start()
        node.start(cluster)
        print(f"node Ready: {node.timings}; cluster {cluster.start_seconds:.1f} s")
        if "--hold" in sys.argv:
            print(f"KUBECONFIG={cluster.admin_kubeconfig}; Ctrl-C stops")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    finally:
        problems = node.stop()
        cluster.stop()
        print(f"logs in {node.logs}; not undone: {problems}; left: {node.leftovers()}")


if __name__ == "__main__":
    main()
