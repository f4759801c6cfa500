"""Where a Kubernetes job's master stands: what it learns about itself at start.

Its own pod's uid (every object it creates is owned by that pod, so deleting the master
pod deletes the job), its address (its Service's cluster IP, which the notebook created),
and the address of each PS: a Service per PS, made before any pod, so each PS serves at
a fixed address (workers ask the master for it, as they do locally) and a relaunched PS
comes back at the same one. Cluster IPs,
not DNS names: the job works without cluster DNS, and a relaunched PS is reachable at
once (no DNS cache to go stale).
"""

from __future__ import annotations

import json
from pathlib import Path

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, client_for
from elasticdl_nb.backends.kubernetes.launcher import PodLauncher
from elasticdl_nb.runtime.master.site import EventSink
from elasticdl_nb.runtime.protocol.channels import listen
from elasticdl_nb.spec import JobSpec

# Kubernetes shows this file's content as the pod's termination message (4 KB at most):
# the final state reaches the notebook even where it cannot read the shared volume.
TERMINATION_LOG = Path("/dev/termination-log")


class KubernetesSite:
    def __init__(self, spec: JobSpec, name: str):
        self.spec, self.name = spec, name

    def open(self) -> None:
        from kubernetes import client

        # In the pod: its service account (the spec's kubeconfig is the notebook's).
        self.api = client.CoreV1Api(client_for(in_cluster=True))
        spec, name = self.spec, self.name
        ns, master = spec.namespace, m.master_name(name)
        me = call(f"read the master's own pod {master}", self.api.read_namespaced_pod, master, ns)
        self.owner = m.owner_reference(master, me["metadata"]["uid"])
        self.address = f"{self._cluster_ip(m.master_service(spec, name))}:{m.MASTER_PORT}"
        ps = [
            f"{self._cluster_ip(m.ps_service(spec, name, i, self.owner))}:{m.PS_PORT}"
            for i in range(spec.parameter_servers)
        ]
        self.addresses = m.Addresses(self.address, tuple(ps))

    @property
    def ps_addrs(self) -> list[str]:
        return list(self.addresses.ps)

    def bind(self, server) -> str:
        """Listen on every address of the pod at the master's port; returns the address
        to advertise (its Service's). Not only the pod IP: a port-forward (how a notebook
        outside the cluster reaches the master) arrives on the pod's loopback, where the
        container runtime dials `localhost:<port>` inside the pod's network namespace."""
        listen(server, f"0.0.0.0:{m.MASTER_PORT}")
        return self.address

    def launcher(self, env: dict[str, str], on_event: EventSink) -> PodLauncher:
        del env  # pods get theirs from their manifests
        launcher = PodLauncher(
            self.spec, self.name, self.api, self.owner["uid"], on_event, self.addresses
        )
        return launcher.start()

    def job_ended(self, status: dict) -> None:
        """The final status as the pod's termination message, where `kubectl` and the
        notebook read it."""
        text = json.dumps(status)
        if len(text) > 4000:
            text = json.dumps({k: status.get(k) for k in ("name", "state", "error")})[:4000]
        try:
            TERMINATION_LOG.write_text(text)
        except OSError:
            pass  # not in a pod that has one

    def _cluster_ip(self, service: dict) -> str:
        """The cluster IP of `service`, created if it is not there yet."""
        ns, obj_name = self.spec.namespace, service["metadata"]["name"]
        found = call(
            f"read Service {obj_name}", self.api.read_namespaced_service, obj_name, ns, allow=(404,)
        )
        if found is None:
            what = f"create Service {obj_name}"
            found = call(what, self.api.create_namespaced_service, ns, service, allow=(409,))
            if found is None:  # made meanwhile (a second master start): read it
                found = call(
                    f"read Service {obj_name}", self.api.read_namespaced_service, obj_name, ns
                )
        ip = (found.get("spec") or {}).get("clusterIP")
        if not ip or ip == "None":
            raise KubernetesError(f"Service {obj_name} has no cluster IP; the job needs one.")
        return ip
