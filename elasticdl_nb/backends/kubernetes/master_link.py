"""How the notebook reaches a Kubernetes job's master.

The master runs in the pod of the job's Job; that pod may be replaced (deleted,
evicted), and a replacement has another name, so the master's pod is found by its
labels: the newest one not being deleted. Whether the master runs is that pod's phase
and readiness. Where it is reached: inside the cluster, at its Service's DNS name (or,
where the cluster's DNS does not answer for it within `DNS_SECONDS`, at the Service's
cluster IP, which every pod routes); outside, at the Service's cluster IP if this
machine routes the service range (a node, a local test cluster), else through a
port-forward via the API server to whichever pod is the master when a connection opens.
The Service selects the master by labels, so its address stays. Whether the master runs
at all, has ended, is lost or is still starting is `job_state`'s reading of the master's
Job, its pod and the job's files (where the notebook sees the shared volume; where it
does not, the final state comes from the master pod's termination message): the master
is asked only while that says it runs, so an ended job answers from what its end left,
at once.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import (
    KubernetesError,
    call,
    client_for,
    explain,
    in_a_pod,
)
from elasticdl_nb.backends.kubernetes.job_state import Reading, current_pod, job_state
from elasticdl_nb.vocabulary import JobState

POD_CACHE_SECONDS = 0.5  # status polls come often; the API server need not see each
DNS_SECONDS = 2.0  # a pod's resolver that has not answered by then is not going to


class KubernetesMasterLink:
    def __init__(self, record: JobRecord):
        self.record = record
        self.namespace: str = record.where["namespace"]
        self._api = None
        self._batch = None
        self._pod: tuple[float, dict | None] = (0.0, None)
        self._job: tuple[float, dict | None] = (0.0, None)
        self._route: str | None = None  # the master's address, as this machine reaches it
        self._forward = None  # a PortForward, when that is the route

    @property
    def api(self):
        """The core API (pods, logs, port-forwards)."""
        return self._clients()[0]

    @property
    def batch(self):
        """The batch API (the master's Job)."""
        return self._clients()[1]

    def _clients(self):
        if self._api is None:
            from kubernetes import client

            api_client = client_for(self.record.where.get("kubeconfig", ""))
            self._api, self._batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        return self._api, self._batch

    @property
    def files(self) -> Path:
        return self._files or self.record.dir

    @property
    def _files(self) -> Path | None:
        """The job directory on the shared volume, where this machine sees it."""
        local = self.record.where.get("files")
        return Path(local) if local else None

    def master_pod(self) -> dict | None:
        """The job's current master pod (None while there is none)."""
        read_at, pod = self._pod
        if time.monotonic() - read_at > POD_CACHE_SECONDS:
            try:
                pod = current_master_pod(self.api, self.record.name, self.namespace)
            except KubernetesError:
                pod = self._pod[1]  # out of reach for a moment: what we knew last
            self._pod = (time.monotonic(), pod)
        return pod

    def master_job(self) -> dict | None:
        """The master's Job (None once it is gone)."""
        read_at, job = self._job
        if time.monotonic() - read_at > POD_CACHE_SECONDS:
            name = m.master_name(self.record.name)
            try:
                job = call(
                    f"read Job {name}",
                    self.batch.read_namespaced_job,
                    name,
                    self.namespace,
                    allow=(404,),
                )
            except KubernetesError:
                job = self._job[1]
            self._job = (time.monotonic(), job)
        return job

    def reading(self) -> Reading:
        """The job's state now (`job_state`), from the Job and pod as last read."""
        return job_state(
            self.record.name, self.namespace, self.master_job(), self.master_pod(), self._files
        )

    def address(self) -> str | None:
        """The master's route while the job runs (its pod ready: the readiness probe is
        that the gRPC port accepts; its end not recorded), else None."""
        return self.route() if self.reading().state == JobState.RUNNING else None

    def route(self) -> str:
        if self._route is None:
            name = m.master_name(self.record.name)
            cluster_ip = self.record.where["master_address"]
            if in_a_pod():
                host = f"{name}.{self.namespace}.svc"
                resolved = _resolves(host, DNS_SECONDS)
                self._route = f"{host}:{m.MASTER_PORT}" if resolved else cluster_ip
            elif _reachable(cluster_ip):
                self._route = cluster_ip
            else:
                from kubernetes import client

                from elasticdl_nb.backends.kubernetes.port_forward import (
                    PortForward,
                    pod_stream_opener,
                )

                def master() -> str:
                    pod = current_master_pod(self.api, self.record.name, self.namespace)
                    if pod is None:
                        raise KubernetesError(f"job {self.record.name!r} has no master pod now")
                    return pod["metadata"]["name"]

                # A client of its own: see pod_stream_opener.
                streams = client.CoreV1Api(client_for(self.record.where.get("kubeconfig", "")))
                opener = pod_stream_opener(streams, master, self.namespace, m.MASTER_PORT)
                self._forward = PortForward(opener)
                self._route = self._forward.address
        return self._route

    def waiting_reason(self) -> str:
        """Why the master is not reached ('' if nothing is known): its pod not running
        yet, or the port-forward to it refused."""
        reading = self.reading()
        if reading.state == JobState.STARTING:
            return reading.why
        if reading.state == JobState.RUNNING and self._forward and self._forward.failure:
            return (
                f"the master runs, but the port-forward to it fails ({self._forward.failure})."
                " Fix: the notebook's user needs `get` and `create` on pods/portforward, as"
                " deploy/rbac.yaml's user Role grants"
            )
        return ""

    def final_state(self) -> dict | None:
        """The status the job ended with: recorded by its master in the job directory or
        its pod's termination message (or, for an end that cannot be read here, one that
        says so)."""
        return self.reading().final

    def lost_reason(self) -> str:
        """Why the job is gone without an end state ('' unless it is): its Job deleted,
        or failed (the master failed more often than the Job's backoffLimit)."""
        reading = self.reading()
        return reading.why if reading.state == JobState.LOST else ""

    def kill(self, grace_seconds: float = 10.0) -> None:
        """Delete the master's Job: the garbage collector takes every object it owns,
        pods included. Its master pod is deleted as well, with `grace_seconds` to stop
        (its Job being deleted, it stops the job) rather than the pod's own default. A
        master that never ran (its image cannot be pulled, it cannot be scheduled) has
        nothing to end gracefully, and a kubelet busy pulling would keep the pod a while:
        it goes at once."""
        from elasticdl_nb.backends.kubernetes.submit import delete_job

        pod = self.master_pod()
        if ((pod or {}).get("status") or {}).get("phase") == "Pending":
            grace_seconds = 0
        delete_job(self.batch, self.record.name, self.namespace)
        pods = call(
            "list the job's master pods",
            self.api.list_namespaced_pod,
            self.namespace,
            label_selector=m.master_selector(self.record.name),
        )
        for item in pods.get("items", []):
            pod_name = item["metadata"]["name"]
            call(
                f"delete pod {pod_name}",
                self.api.delete_namespaced_pod,
                pod_name,
                self.namespace,
                grace_period_seconds=int(grace_seconds),
                allow=(404,),
            )
        self._pod = self._job = (0.0, None)

    def read_log(self, role: str, index: int, tail: int | None = None) -> str | None:
        """The container's log through the API server (`pods/log`): where the notebook
        does not see the shared volume. None once the pod is gone."""
        if role == "master":
            pod = self.master_pod()
            if pod is None:
                return None
            name = pod["metadata"]["name"]
        else:
            name = m.pod_name(self.record.name, role, index)
        extra = {"tail_lines": tail} if tail else {}
        from kubernetes.client.rest import ApiException

        try:
            response = self.api.read_namespaced_pod_log(
                name, self.namespace, _preload_content=False, _request_timeout=15, **extra
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # gone, or not started yet: no container log
                return None
            raise KubernetesError(explain(f"read the log of pod {name}", exc)) from None
        return response.data.decode(errors="replace")


def current_master_pod(api, name: str, namespace: str) -> dict | None:
    """The master pod of job `name` that counts now (`current_pod`)."""
    pods = call(
        f"list the master pods of job {name!r}",
        api.list_namespaced_pod,
        namespace,
        label_selector=m.master_selector(name),
    )
    return current_pod(pods.get("items", []))


def _resolves(host: str, timeout: float) -> bool:
    """Whether the resolver answers for `host` within `timeout` seconds. The name is the
    better route (it follows the Service if it is recreated), but a cluster without DNS,
    or with DNS that does not serve this pod (a dnsPolicy of its own, a resolver down),
    would leave every call to fail with "DNS resolution failed" after its retries: the
    Service's cluster IP serves then. The lookup runs in a thread of its own, as
    getaddrinfo has no timeout of its own (a resolver that does not answer takes
    resolv.conf's attempts × timeout, 10 s by default)."""
    answer: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, None)
            answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=lookup, name="resolve-master", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def _reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether this machine routes to `address`: a connection, or a refusal (the master
    is not listening yet), says so; a timeout or an unreachable network says not."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
