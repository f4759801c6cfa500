"""The real node as the elastic-scheduling benchmarks use it (elastic_scheduling.py,
elastic_service.py, elastic_growth.py): started for one run, a shared hostPath for the
jobs' directories, every container's CPU limit a worker's request (a pod template, so a
pod's speed follows the CPU the scheduler gave it), a fresh namespace per measured run,
and the CPU each job or service requests and uses over time.

The node keeps RESERVED_CPU_M of the machine's 2 cores from pods (the kubelet's
--kube-reserved): here the API server, etcd, the scheduler, the kubelet, containerd and
the benchmark itself share the cores with the pods, and with every core given to pods
that use their limits, a pod took 10-30 s to start (a cluster's control plane runs on
machines of its own, and its nodes reserve CPU for the kubelet and the runtime).
elastic_scheduling.py gives pods the whole 2000m: its pods use 0.76-0.92 of their
requests and ran 1-2 s after they were made.

    with NodeBench("elastic") as bench:           # (skipped: bench.unavailable)
        namespace, options = bench.run_options()  # edl.train(..., **options)
        sampler = CpuSampler(bench.core, namespace, bench.node).start()
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from pod_timeline import Poller

from tests.kubernetes import node_session
from tests.kubernetes.node_cpu import allocatable_millicores, requested_millicores

# Millicores requested by a job's master, PS and each worker; every container's CPU limit
# is CPU_LIMIT.
MASTER_CPU, PS_CPU, WORKER_CPU, CPU_LIMIT = 100, 200, 200, 200
RESERVED_CPU_M = 500  # allocatable: 1500m of the 2000m
SAMPLE_S = 0.5


class NodeBench:
    """A context: the node started on entry (`core`, `node`, `allocatable`, `session`;
    `details` gets its start-up seconds and what its stop left undone), everything
    removed on exit."""

    def __init__(self, prefix: str, reserved_cpu_m: int = RESERVED_CPU_M):
        self.prefix = prefix
        self.details: dict[str, Any] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix=f"edl-bench-{prefix}-"))
        self.session = node_session.NodeSession(
            self.workdir / "node", reserved_cpu_m=reserved_cpu_m
        )
        self.details["reserved_cpu_m"] = reserved_cpu_m
        self.core = self.node = None
        self.allocatable = 0

    def __enter__(self) -> NodeBench:
        from kubernetes import client

        try:
            harness.log("starting the real node")
            self.session.start()
            self.details["node_start_s"] = dict(self.session.seconds)
            self.core = client.CoreV1Api(self.session.admin)
            self.node = self.session.node.name
            self.allocatable = allocatable_millicores(self.core, self.node)
            self.shared = self.workdir / "shared"
            self.shared.mkdir()
            self.shared.chmod(0o777)  # hostPath ignores fsGroup: the pods' uid 1000 writes
            self.template = self.workdir / "cpu-limit.yaml"
            limit = {"resources": {"limits": {"cpu": f"{CPU_LIMIT}m"}}}
            self.template.write_text(json.dumps({"spec": {"containers": [limit]}}))  # (YAML)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.details["node_not_undone"] = self.session.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def run_options(self) -> tuple[str, dict[str, Any]]:
        """A new namespace set up for jobs, and the train() options of a job there."""
        namespace = self.session.job_namespace()
        pins = {**harness.THREAD_PINS, "TF_CPP_MIN_LOG_LEVEL": "2"}
        return namespace, dict(
            backend="kubernetes",
            namespace=namespace,
            kubeconfig=str(self.session.cluster.user_kubeconfig),
            shared_volume=f"hostPath:{self.shared}",
            master_resources=f"cpu={MASTER_CPU}m,memory=1Gi",
            ps_resources=f"cpu={PS_CPU}m,memory=1Gi",
            worker_resources=f"cpu={WORKER_CPU}m,memory=1Gi",
            pod_template=str(self.template),
            env=[f"{k}={v}" for k, v in pins.items()],
            record_ledger=True,
        )


def skipped(name: str, title: str, command: str) -> bool:
    """Whether the node benchmarks cannot run here; if so, says why in the log and in
    the benchmark's result (`name`)."""
    why_not = node_session.unavailable()
    if why_not:
        harness.log(f"skipped: {why_not}")
        harness.write_result(name, title, [], {"skipped": why_not}, command=command)
    return bool(why_not)


class CpuSampler(Poller):
    """Every SAMPLE_S: the CPU each job's (or service's) pods request on the node (pods
    placed and not ended), and every few samples what they use (kubelet summary)."""

    interval = SAMPLE_S

    def __init__(self, core, namespace: str, node: str):
        super().__init__("cpu-sampler")
        self.core, self.namespace, self.node = core, namespace, node
        self.samples: list[dict[str, Any]] = []  # {"t", "requested": {job: m}, "used": ...}
        self.usage_error = ""

    def poll(self) -> None:
        sample: dict[str, Any] = {"t": time.time(), "requested": {}}
        requested = sample["requested"]
        try:
            for p in self.core.list_namespaced_pod(self.namespace).items:
                labels = p.metadata.labels or {}
                # A job's pods by its name; a Deployment's (elastic_service.py) by app.
                job = labels.get("elasticdl-nb/job") or labels.get("app")
                if job and p.spec.node_name:
                    requested[job] = requested.get(job, 0) + requested_millicores(p)
            if len(self.samples) % 4 == 0:
                sample["used"], sample["used_by_role"] = self._used()
        except Exception as exc:  # (the API server busy: a gap in the samples)
            sample["error"] = repr(exc)
        self.samples.append(sample)

    def _used(self) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Millicores each job's pods use now, by the kubelet's summary; and by role
        (master, ps, worker, or the service's name): each pod's millicores."""
        if self.usage_error:
            return {}, {}
        try:
            reply = self.core.connect_get_node_proxy_with_path(
                self.node, "stats/summary", _preload_content=False
            )
            summary = json.loads(reply.data)
        except Exception as exc:
            self.usage_error = f"no kubelet summary: {exc!r}"[:300]
            return {}, {}
        used: dict[str, float] = {}
        by_role: dict[str, list[float]] = {}
        for pod in summary.get("pods", []):
            ref = pod.get("podRef", {})
            if ref.get("namespace") != self.namespace:
                continue
            job = ref.get("name", "").rsplit("-", 2)[0]
            nano = (pod.get("cpu") or {}).get("usageNanoCores") or 0
            used[job] = used.get(job, 0.0) + nano / 1e6
            by_role.setdefault(pod_role(ref.get("name", "")), []).append(round(nano / 1e6))
        return used, by_role


def pod_role(pod_name: str) -> str:
    """A job pod's role from its name (JOB-master-xxxxx, JOB-ps-0, JOB-worker-3), or
    "service" for the others (elastic_service.py's Deployment)."""
    parts = pod_name.rsplit("-", 2)
    return parts[1] if len(parts) == 3 and parts[1] in ("master", "ps", "worker") else "service"


def usage_by_role(run: dict[str, Any]) -> dict[str, float]:
    """Millicores a pod of each role used, averaged over every pod of the role at every
    sample that measured use (the figure to set its request by)."""
    pods: dict[str, list[float]] = {}
    for s in run["samples"]:
        for role, each in (s.get("used_by_role") or {}).items():
            pods.setdefault(role, []).extend(each)
    return {role: round(sum(m) / len(m)) for role, m in sorted(pods.items()) if m}


def utilization(run: dict[str, Any], allocatable: int) -> float:
    """Requested CPU over allocatable, averaged over the makespan (samples in it)."""
    end = run["t0"] + run["makespan_s"]
    inside = [s for s in run["samples"] if run["t0"] <= s["t"] <= end and "error" not in s]
    if not inside:
        return 0.0
    return sum(sum(s["requested"].values()) for s in inside) / len(inside) / allocatable


def usage_share(run: dict[str, Any]) -> float | None:
    """What the jobs' pods used over what they requested, at the samples that say both."""
    pairs = [
        (sum(s["used"].values()), sum(s["requested"].values()))
        for s in run["samples"]
        if s.get("used") and sum(s["requested"].values())
    ]
    if not pairs:
        return None
    return sum(u for u, _ in pairs) / sum(r for _, r in pairs)


def ideal_pair(
    alone_s: float,
    offset_s: float,
    speed_beside: float,
    cpu_max: int,
    cpu_beside: int,
    allocatable: int,
    longer: float = 1.0,
) -> dict[str, float]:
    """The best any scheduler does with two jobs that each run `alone_s` alone at MAX
    (asking `cpu_max`), the second `longer` times that and submitted `offset_s` later,
    with nothing lost to start-ups: gang runs them one after the other; elastic gives the
    second, until the first ends, the workers that fit beside it (asking `cpu_beside`,
    its master and PS included), at `speed_beside` of its speed at MAX (the workers it
    gets over its MAX: speed follows workers, a job's master and PS are a fixed cost),
    then its MAX. Returns the elastic makespan over gang's ("ratio") and the CPU the two
    ask for over `allocatable`, averaged over the elastic makespan ("requested")."""
    t, work = alone_s, longer * alone_s
    beside_s = t - offset_s
    if beside_s * speed_beside >= work:  # the second ends before the first does
        elastic, beside_s, alone_after = t, work / speed_beside, 0.0
    else:
        alone_after = work - beside_s * speed_beside
        elastic = t + alone_after
    asked = cpu_max * t + cpu_beside * beside_s + cpu_max * alone_after
    return {"ratio": elastic / (t + work), "requested": asked / (allocatable * elastic)}
