"""How the notebook reaches a Kubernetes job's master.

Whether the master runs is its pod's phase. Where it is reached: inside the cluster, at
its Service's DNS name; outside, at the Service's cluster IP if this machine routes the
service range (a node, a local test cluster), else through a port-forward to the pod via
the API server. The job's files are read where the notebook sees the shared volume;
where it does not, the final state still comes from the master pod's termination message.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, client_for, explain
from elasticdl_nb.runtime.job_dir import JobDir, read_json

POD_CACHE_SECONDS = 0.5  # status polls come often; the API server need not see each


class KubernetesMasterLink:
    def __init__(self, record: JobRecord):
        self.record = record
        self.namespace: str = record.where["namespace"]
        self._api = None
        self._pod: tuple[float, dict | None] = (0.0, None)
        self._route: str | None = None  # the master's address, as this machine reaches it
        self._forward = None  # a PortForward, when that is the route

    @property
    def api(self):
        if self._api is None:
            from kubernetes import client

            self._api = client.CoreV1Api(client_for(self.record.where.get("kubeconfig", "")))
        return self._api

    @property
    def files(self) -> Path:
        local = self.record.where.get("files")
        return Path(local) if local else self.record.dir

    def master_pod(self) -> dict | None:
        read_at, pod = self._pod
        if time.monotonic() - read_at > POD_CACHE_SECONDS:
            name = m.master_name(self.record.name)
            try:
                pod = call(
                    f"read pod {name}",
                    self.api.read_namespaced_pod,
                    name,
                    self.namespace,
                    allow=(404,),
                )
            except KubernetesError:
                pod = self._pod[1]  # out of reach for a moment: what we knew last
            self._pod = (time.monotonic(), pod)
        return pod

    def address(self) -> str | None:
        """The master's route once its pod is ready (its readiness probe: the gRPC port
        accepts), else None."""
        status = (self.master_pod() or {}).get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        return self.route() if status.get("phase") == "Running" and ready else None

    def route(self) -> str:
        if self._route is None:
            name = m.master_name(self.record.name)
            cluster_ip = self.record.where["master_address"]
            if os.environ.get("KUBERNETES_SERVICE_HOST"):  # we run in a pod
                self._route = f"{name}.{self.namespace}.svc:{m.MASTER_PORT}"
            elif _reachable(cluster_ip):
                self._route = cluster_ip
            else:
                from elasticdl_nb.backends.kubernetes.port_forward import (
                    PortForward,
                    pod_stream_opener,
                )

                opener = pod_stream_opener(self.api, name, self.namespace, m.MASTER_PORT)
                self._forward = PortForward(opener)
                self._route = self._forward.address
        return self._route

    def waiting_reason(self) -> str:
        """Why the master is not reached ('' if nothing is known): its pod not running
        yet, or the port-forward to it refused."""
        from elasticdl_nb.backends.kubernetes.pod_events import waiting_reason

        pod = self.master_pod()
        why = waiting_reason(pod) if pod else ""
        if not why and self._forward is not None and self._forward.failure:
            why = (
                f"the master runs, but the port-forward to it fails ({self._forward.failure})."
                " Fix: the notebook's user needs `get` and `create` on pods/portforward, as"
                " deploy/rbac.yaml's user Role grants"
            )
        return why

    def final_state(self) -> dict | None:
        state = read_json(JobDir(self.files).state)
        if state is not None:
            return state
        pod = self.master_pod()  # its termination message is the same JSON
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        message = ((statuses[0].get("state") or {}).get("terminated") or {}).get("message")
        try:
            return json.loads(message) if message else None
        except ValueError:
            return None

    def lost_reason(self) -> str:
        """Why the job is gone without an end state ('' unless it is)."""
        pod = self.master_pod()
        name = m.master_name(self.record.name)
        if pod is None:
            return (
                f"its master pod {name} is gone (deleted?) without an end state; the "
                "job's other objects went with it"
            )
        if (pod.get("status") or {}).get("phase") == "Failed":
            return (
                f"its master pod {name} failed without an end state; see "
                f"`kubectl logs -n {self.namespace} {name}`"
            )
        return ""

    def kill(self, grace_seconds: float = 10.0) -> None:
        """Delete the master pod: the garbage collector takes every object it owns. A
        master that never ran (its image cannot be pulled, it cannot be scheduled) has
        nothing to end gracefully, and a kubelet busy pulling would keep the pod a while:
        it goes at once."""
        name = m.master_name(self.record.name)
        phase = ((self.master_pod() or {}).get("status") or {}).get("phase")
        if phase == "Pending":
            grace_seconds = 0
        call(
            f"delete pod {name}",
            self.api.delete_namespaced_pod,
            name,
            self.namespace,
            grace_period_seconds=int(grace_seconds),
            allow=(404,),
        )

    def read_log(self, role: str, index: int, tail: int | None = None) -> str | None:
        """The container's log through the API server (`pods/log`): where the notebook
        does not see the shared volume. None once the pod is gone."""
        name = (
            m.master_name(self.record.name)
            if role == "master"
            else m.pod_name(self.record.name, role, index)
        )
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
