"""A real, throw-away Kubernetes control plane on loopback, for tests.

`TestCluster` runs three processes from the binaries that
`tests/kubernetes/build_cluster_binaries.sh` (`make test-cluster`) builds:

- etcd, with its data in the cluster's work dir;
- kube-apiserver v1.20.2 on https://127.0.0.1:<free port>, TLS from a CA made here,
  static bearer tokens (an admin in `system:masters` and an unprivileged user, for
  RBAC tests), `--authorization-mode=Node,RBAC`, service-account signing keys;
- kube-controller-manager with only the garbagecollector, namespace, serviceaccount,
  serviceaccount-token and resourcequota controllers, so owner references, namespace
  deletion, service-account tokens and quotas behave as on a real cluster.

There is no kubelet and no scheduler: pods are stored but never run. A pod with
`spec.nodeName` set is deleted at once only with `grace_period_seconds=0`.

For a real node (node.py) the keyword options of `TestCluster` change that: the API
server on the node's address instead of loopback (pods reach it through the `kubernetes`
Service, which the API server then fills), a Service range that is not loopback, the
kubelet reached at the node's InternalIP, the job, deployment, replicaset, endpoint,
endpointslice, nodelifecycle and persistentvolume-binder controllers (a job's master is a
Job's pod; a benchmark's service is a Deployment; kube-proxy needs endpoints; the node's
`not-ready` taint must go; claims must bind), a node called lost after NODE_GRACE_SECONDS
without a status, and the node's own static token. (The
node-less cluster has no job controller: a Job there is stored, and makes no pod, as
nothing would run it.) The defaults are the loopback cluster above.

Keys and certificates are made with the `openssl` command line, so the tests need no
extra Python package. Every process logs to `<workdir>/logs/<name>.log`.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

K8S_VERSION = "1.20.2"
BUILD_COMMAND = "make test-cluster  (runs tests/kubernetes/build_cluster_binaries.sh)"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
# Service cluster IPs of the node-less cluster: loopback addresses (Linux routes all of
# 127/8 to `lo`), never used by a pod there. The API server takes the first address for
# the `kubernetes` Service. A cluster for a real node passes its own range.
SERVICE_IP_RANGE = "127.1.0.0/16"
KUBERNETES_SERVICE_IP = "127.1.0.1"
# Tuning of a cluster for real nodes: a node is lost after NODE_GRACE_SECONDS without a
# status from its kubelet (Kubernetes' default: 40 s), which posts every 4 s here
# (node.NODE_STATUS_SECONDS). Its pods are evicted after their not-ready/unreachable
# tolerations: the default the API server gives every pod (300 s) is left alone, and the
# node-loss tests give their jobs 5 s through the user's pod template, as a user would.
NODE_GRACE_SECONDS = 20

# Controllers of every test cluster; a cluster for real nodes adds NODE_CONTROLLERS.
CONTROLLERS = (
    "garbagecollector",
    "namespace",
    "serviceaccount",
    "serviceaccount-token",
    "resourcequota",  # quota usage, without which quota admission refuses all
)
NODE_CONTROLLERS = (
    "job",  # a job's master runs in the pod of a batch/v1 Job, which replaces it if it goes
    "endpoint",
    "endpointslice",
    "nodelifecycle",
    "persistentvolume-binder",  # a job on a claim (pvc:) whose files the notebook cannot see
    "deployment",  # a service beside training (bench/elastic_service.py) is a Deployment
    "replicaset",
)


def first_service_ip(service_ip_range: str) -> str:
    """The address the API server gives the `kubernetes` Service."""
    return str(ipaddress.ip_network(service_ip_range)[1])


def binaries_dir() -> Path:
    """Where build_cluster_binaries.sh puts the binaries (same env override)."""
    root = os.environ.get("ELASTICDL_NB_CACHE") or str(Path.home() / ".cache" / "elasticdl-nb")
    return Path(root) / f"k8s-{K8S_VERSION}" / "bin"


class ClusterBinariesMissing(RuntimeError):
    pass


class ClusterStartError(RuntimeError):
    pass


def _free_port() -> int:
    # The OS picks a free loopback port; the small race until the server binds it is
    # accepted (ports are taken from the ephemeral range, rarely reused at once).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_pki(pki: Path, address: str, service_ip: str) -> None:
    """A CA, a serving certificate for the API server signed by it, and the RSA key
    pair that signs and verifies service-account tokens."""
    pki.mkdir(parents=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=elasticdl-nb-test-ca",
        cwd=pki,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=pki,
    )
    # The names clients use: loopback, the
    # address the server listens on, and the in-cluster names and service IP (the first
    # of the service range) of the API service.
    ips = dict.fromkeys(["127.0.0.1", address, service_ip])
    (pki / "san.ext").write_text(
        "subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        f"DNS:kubernetes.default.svc,{','.join(f'IP:{ip}' for ip in ips)}\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        "san.ext",
        "-out",
        "apiserver.crt",
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class TestCluster:
    """etcd + kube-apiserver + kube-controller-manager on loopback.

    Use as a context manager, or call `start()` and `stop()`. After `start()`:
    `server` (URL), `ca_file`, `admin_token`, `user_token`, `user_name`, and the
    kubeconfig files `admin_kubeconfig` and `user_kubeconfig`.

    Keyword options, for a real node (node.py's `RealNode.cluster_options()` gives them):
    `address`, where the API server listens and what it advertises (it must exist on
    this machine); `service_ip_range`; `real_nodes`, which adds the node controllers,
    an endpoint reconciler for the `kubernetes` Service and reaching kubelets at their
    InternalIP; `extra_tokens`, more static tokens as (token, user, groups) with groups
    comma-separated, e.g. a node's (token, "system:node:NAME", "system:nodes").
    """

    __test__ = False  # not a pytest test class, despite the name

    user_name = "unprivileged"

    def __init__(
        self,
        workdir: Path | str | None = None,
        bin_dir: Path | None = None,
        *,
        address: str = "127.0.0.1",
        service_ip_range: str = SERVICE_IP_RANGE,
        real_nodes: bool = False,
        extra_tokens: tuple[tuple[str, str, str], ...] = (),
    ):
        self.bin_dir = Path(bin_dir) if bin_dir else binaries_dir()
        self.address = address
        self.service_ip_range = service_ip_range
        self.kubernetes_service_ip = first_service_ip(service_ip_range)
        self.real_nodes = real_nodes
        self.extra_tokens = tuple(extra_tokens)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="k8s-test-"))
        self.logs = self.workdir / "logs"
        self.pki = self.workdir / "pki"
        self.ca_file = self.pki / "ca.crt"
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self.user_kubeconfig = self.workdir / "user.kubeconfig"
        self.admin_token = secrets.token_hex(16)
        self.user_token = secrets.token_hex(16)
        self.procs: dict[str, subprocess.Popen] = {}
        self.server = ""
        self.start_seconds: float | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 90) -> TestCluster:
        self._check_binaries()
        t0 = time.monotonic()
        atexit.register(self.stop)  # also when the test session dies without teardown
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            _make_pki(self.pki, self.address, self.kubernetes_service_ip)
            self._start_etcd(deadline=t0 + timeout)
            self._start_apiserver(deadline=t0 + timeout)
            self._write_kubeconfigs()
            self._start_controller_manager(deadline=t0 + timeout)
        except BaseException:
            self.stop(keep_workdir=True)  # keep the logs to read
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self, keep_workdir: bool = False) -> None:
        # Reverse order: controllers first, etcd last.
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._own_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TestCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- information -------------------------------------------------------------------

    def rss_mib(self) -> dict[str, float | None]:
        """Resident memory of each process, in MiB."""
        return {name: _rss_mib(proc.pid) for name, proc in self.procs.items()}

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def request(self, path: str, token: str | None = None) -> tuple[int, dict | str]:
        """GET `path` from the API server (admin token by default): (status, body)."""
        req = urllib.request.Request(
            self.server + path,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
        )
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                status, body = resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read().decode()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def etcd(self, method: str, body: dict) -> dict:
        """A call to etcd's JSON gateway, e.g. ('kv/deleterange', {'key': b64}): how a
        test changes what the API server stores while the server is down."""
        req = urllib.request.Request(
            f"{self.etcd_url}/v3/{method}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.load(resp)

    def default_service_account(self, namespace: str) -> dict | None:
        """The `default` service account of `namespace` once it has its token secret."""
        status, body = self.request(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        return body if status == 200 and body.get("secrets") else None

    def wait_for_default_service_account(self, namespace: str, timeout: float = 30) -> dict:
        """Wait until the controller-manager has made the `default` service account of
        `namespace` and its token secret. Until then the ServiceAccount admission plugin
        (on by default in 1.20) rejects pods in that namespace."""
        deadline = time.monotonic() + timeout
        while (account := self.default_service_account(namespace)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no token for {namespace}/default after {timeout}s")
            time.sleep(0.2)
        return account

    # --- the processes -----------------------------------------------------------------

    def _check_binaries(self) -> None:
        missing = [b for b in BINARIES if not os.access(self.bin_dir / b, os.X_OK)]
        if missing:
            raise ClusterBinariesMissing(
                f"test-cluster binaries missing in {self.bin_dir}: {', '.join(missing)}. "
                f"Build them once (~8 min, cached) with: {BUILD_COMMAND}"
            )

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # (a restart's log goes on)
        # A session of its own: a Ctrl-C meant for pytest does not hit the servers
        # before the fixture's teardown stops them in order.
        proc = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, ready, deadline: float) -> None:
        """Poll `ready()` until it is true; fail early, with the log, if `name` exits."""
        while True:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ClusterStartError(
                    f"{name} exited with {proc.returncode}; its log ends:\n{self.log_tail(name)}"
                )
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"{name} not ready in time; its log ends:\n{self.log_tail(name)}"
                )
            time.sleep(0.2)

    def _start_etcd(self, deadline: float) -> None:
        client, peer = _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn(
            "etcd",
            [
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--unsafe-no-fsync",  # test data: speed over durability
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return json.load(resp).get("health") == "true"

        self._wait("etcd", healthy, deadline)

    def restart_apiserver(self, while_down=None, timeout: float = 60) -> None:
        """Kill kube-apiserver (SIGKILL: a graceful stop waits out every open watch) and
        start it again on the same port, as a crash does; clients see their connections
        cut and refused. `while_down()` runs in between (e.g. changing etcd behind the
        server's back)."""
        proc = self.procs.pop("kube-apiserver")
        proc.kill()
        proc.wait(timeout=30)
        if while_down:
            while_down()
        time.sleep(0.5)
        port = int(self.server.rsplit(":", 1)[1])
        self._start_apiserver(time.monotonic() + timeout, port)

    def restart_controller_manager(self, timeout: float = 60) -> None:
        """Stop kube-controller-manager and start it again with the same flags. A cluster
        with several real nodes needs it once they are all Ready: in 1.20.2 the taint
        manager never taints a lost node NoExecute, so never evicts its pods, while an
        entry from the first node's start-up is in its queue (kubernetes#94183, fixed
        after 1.20.2); a fresh controller manager starts with an empty queue."""
        proc = self.procs.pop("kube-controller-manager")
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        self._start_controller_manager(deadline=time.monotonic() + timeout)

    def _start_apiserver(self, deadline: float, port: int | None = None) -> None:
        port = port or _free_port()
        self.server = f"https://{self.address}:{port}"
        tokens = self.workdir / "tokens.csv"
        # token,user,uid,"groups": the admin is in system:masters (all rights, no RBAC
        # objects needed); the other user has no group and so no rights beyond discovery.
        tokens.write_text(
            f'{self.admin_token},admin,admin,"system:masters"\n'
            f"{self.user_token},{self.user_name},{self.user_name}\n"
            + "".join(f'{t},{user},{user},"{groups}"\n' for t, user, groups in self.extra_tokens)
        )
        tokens.chmod(0o600)
        if self.real_nodes:
            node_args = [
                # Fill the `kubernetes` Service's endpoints with this server's address.
                "--endpoint-reconciler-type=lease",
                # Reach kubelets (logs, port-forward) at the node's address, not by name.
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            # No kubelet or real network: nothing to reconcile the `kubernetes` service to.
            node_args = ["--endpoint-reconciler-type=none"]
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={port}",
                f"--cert-dir={self.pki}",
                f"--tls-cert-file={self.pki / 'apiserver.crt'}",
                f"--tls-private-key-file={self.pki / 'apiserver.key'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki / 'sa.pub'}",
                f"--service-account-signing-key-file={self.pki / 'sa.key'}",
                f"--service-cluster-ip-range={self.service_ip_range}",
                *node_args,
                "--allow-privileged=true",
            ],
        )
        # /readyz waits for the post-start hooks too, e.g. RBAC's bootstrap roles.
        self._wait("kube-apiserver", lambda: self.request("/readyz")[0] == 200, deadline)

    def _write_kubeconfigs(self) -> None:
        for path, user, token in (
            (self.admin_kubeconfig, "admin", self.admin_token),
            (self.user_kubeconfig, self.user_name, self.user_token),
        ):
            # JSON is YAML, so every kubeconfig reader accepts it.
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": self.server,
                            "certificate-authority": str(self.ca_file),
                        },
                    }
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            }
            path.write_text(json.dumps(config, indent=2))
            path.chmod(0o600)

    def _start_controller_manager(self, deadline: float) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                # Runs as the admin: simpler than a controller identity, same behaviour here.
                f"--kubeconfig={self.admin_kubeconfig}",
                "--controllers="
                + ",".join(CONTROLLERS + (NODE_CONTROLLERS if self.real_nodes else ())),
                # Signs the tokens of service-account secrets; the CA goes into them as ca.crt.
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--leader-elect=false",
                *(
                    [
                        "--node-monitor-period=2s",
                        f"--node-monitor-grace-period={NODE_GRACE_SECONDS}s",
                    ]
                    if self.real_nodes
                    else []
                ),
                # No serving ports (1.20 still opens an insecure one on 10252 by default).
                "--port=0",
                "--secure-port=0",
            ],
        )
        # Ready when it has done its job once: the `default` service account of the
        # `default` namespace exists and has its token.
        self._wait(
            "kube-controller-manager",
            lambda: self.default_service_account("default") is not None,
            deadline,
        )
