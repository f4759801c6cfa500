"""Where a Kubernetes job's master stands: what it learns about itself at start.

Its owner, the master's Job (its own pod's controller: every object it creates is owned
by the Job, so deleting the Job deletes the job and nothing else does), its address (its
Service's cluster IP, which the notebook created), and the address of each PS: a Service
per PS, made before any pod, so each PS serves at a fixed address (workers ask the master
for it, as they do locally) and a relaunched PS comes back at the same one. Cluster IPs,
not DNS names: the job works without cluster DNS, and a relaunched PS is reachable at
once (no DNS cache to go stale).

A master may be the job's first, or one that takes over from a master that died: the
kubelet restarted its container in the same pod, or the Job made a new pod. It takes
over from the journal in the job directory (the runtime's `recovery.py`). Before that:
- it takes the job's lease (`master_lease.py`), waiting until an earlier master let it
  go or stopped renewing it: one master acts for the job at a time, even when the
  earlier one runs on, cut off, on a node the cluster gave up on;
- a job directory that already holds the final state means the job is over: the
  master exits at once with 0 (the kubelet restarted one that failed after recording
  the end), and the Job completes;
- a job directory without a journal while worker or PS pods of the job exist means the
  journal of the master before is out of reach (it was in the replaced pod's own
  volume, or on another node's hostPath): starting over beside those pods would train
  twice, so the job fails and its pods are ended.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, client_for
from elasticdl_nb.backends.kubernetes.launcher import PodLauncher
from elasticdl_nb.backends.kubernetes.master_lease import MasterLease
from elasticdl_nb.backends.kubernetes.master_signals import take_over_sigterm
from elasticdl_nb.runtime.job_dir import JobDir, read_json
from elasticdl_nb.runtime.master.site import EventSink, Fence
from elasticdl_nb.runtime.protocol.channels import listen
from elasticdl_nb.runtime.protocol.tls import JobTls
from elasticdl_nb.spec import JobSpec

log = logging.getLogger("elasticdl_nb.master")

# Kubernetes shows this file's content as the pod's termination message (4 KB at most):
# the final state reaches the notebook even where it cannot read the shared volume.
TERMINATION_LOG = Path("/dev/termination-log")


class _BeforeTheLease:
    """The fence before the master competes for the lease: it has done nothing yet."""

    def check(self) -> None:
        pass


class KubernetesSite:
    def __init__(
        self, spec: JobSpec, name: str, job_dir: Path, api_client=None, pod_name: str = ""
    ):
        """`api_client` and `pod_name`: the pod's service account and the pod's own name
        (downward API) unless given (tests)."""
        self.spec, self.name, self.job_dir = spec, name, job_dir
        self._api_client, self._pod_name = api_client, pod_name
        self._lease: MasterLease | None = None

    @property
    def fence(self) -> Fence:
        return self._lease or _BeforeTheLease()

    def open(self) -> None:
        from kubernetes import client

        # In the pod: its service account (the spec's kubeconfig is the notebook's).
        api_client = self._api_client or client_for(in_cluster=True)
        self.api, self.batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        spec, name = self.spec, self.name
        files = JobDir(self.job_dir)
        state = read_json(files.state)
        if state is not None:  # restarted after the end was recorded: nothing to do
            log.info("the job is over already (%s); this master exits", state.get("state"))
            self.job_ended(state)
            raise SystemExit(0)
        me = self._own_pod()
        self.owner = self._job_of(me)
        self._lease = MasterLease(
            client.CoordinationV1Api(api_client),
            spec.namespace,
            m.master_name(name),
            self.owner,
            holder=me["metadata"]["name"],
        )
        if not self._lease.acquire(job_over=lambda: files.state.exists()):
            state = read_json(files.state) or {}
            log.info("the job ended while this master waited (%s); it exits", state.get("state"))
            raise SystemExit(0)
        if not files.events.exists():
            self._refuse_to_start_over()
        self.address = f"{self._cluster_ip(m.master_service(spec, name))}:{m.MASTER_PORT}"
        ps = [
            f"{self._cluster_ip(m.ps_service(spec, name, i, self.owner))}:{m.PS_PORT}"
            for i in range(spec.parameter_servers)
        ]
        self.addresses = m.Addresses(self.address, tuple(ps))

    @property
    def ps_addrs(self) -> list[str]:
        return list(self.addresses.ps)

    def bind(self, server, tls: JobTls | None) -> str:
        """Listen on every address of the pod at the master's port; returns the address
        to advertise (its Service's). Not only the pod IP: a port-forward (how a notebook
        outside the cluster reaches the master) arrives on the pod's loopback, where the
        container runtime dials `localhost:<port>` inside the pod's network namespace."""
        listen(server, f"0.0.0.0:{m.MASTER_PORT}", tls)
        return self.address

    def launcher(self, env: dict[str, str], on_event: EventSink) -> PodLauncher:
        del env  # pods get theirs from their manifests
        lease = self._lease
        assert lease is not None, "open() first"
        return PodLauncher(
            self.spec,
            self.name,
            self.api,
            self.owner,
            on_event,
            self.addresses,
            fence=lease.check,
            first_use=lambda: take_over_sigterm(self.job_going, before_leaving=lease.release),
        )

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

    def job_going(self) -> bool:
        """Whether the master's Job is being deleted (so the job is being stopped), as
        against this master pod alone going (deleted, evicted) while the Job stays and
        makes a new one. Out of reach: not known to be going."""
        try:
            job = call(
                f"read Job {self.owner['name']}",
                self.batch.read_namespaced_job,
                self.owner["name"],
                self.spec.namespace,
                allow=(404,),
            )
        except KubernetesError as exc:
            log.warning("cannot tell whether the job is being deleted: %s", exc)
            return False
        if job is None or job["metadata"].get("uid") != self.owner["uid"]:
            return True
        return bool(job["metadata"].get("deletionTimestamp"))

    # ------------------------------------------------------------------ taking over

    def _own_pod(self) -> dict:
        pod_name = self._pod_name or os.environ.get(m.POD_NAME_ENV) or ""
        if not pod_name:
            raise KubernetesError(
                f"{m.POD_NAME_ENV} is not set: a master runs in the pod of its Job, whose "
                "template sets it (manifests.master_pod)."
            )
        return call(
            f"read the master's own pod {pod_name}",
            self.api.read_namespaced_pod,
            pod_name,
            self.spec.namespace,
        )

    def _job_of(self, pod: dict) -> dict:
        """The owner reference to the Job that controls `pod`."""
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and ref.get("controller"):
                return m.owner_reference(ref["name"], ref["uid"])
        raise KubernetesError(
            f"the master's pod {pod['metadata']['name']} is not a Job's: a job's master "
            f"runs in the pod of its Job {m.master_name(self.name)}, which owns every "
            "object of the job."
        )

    def _refuse_to_start_over(self) -> None:
        """No journal here: the job is new, unless pods of it exist already. Then an
        earlier master ran, and its journal is out of this master's reach: end the pods
        and fail the job rather than train it again beside them."""
        pods = call(
            "list the job's pods",
            self.api.list_namespaced_pod,
            self.spec.namespace,
            label_selector=f"{m.LABEL_JOB}={self.name},{m.LABEL_ROLE} in (worker,ps)",
        )
        ours = [
            p["metadata"]["name"]
            for p in pods.get("items", [])
            if any(
                o.get("uid") == self.owner["uid"]
                for o in p["metadata"].get("ownerReferences") or []
            )
        ]
        if not ours:
            return
        for pod_name in ours:
            call(
                f"delete pod {pod_name}",
                self.api.delete_namespaced_pod,
                pod_name,
                self.spec.namespace,
                allow=(404,),
            )
        journal = JobDir(self.job_dir).events
        if not self.spec.shared_volume:
            raise KubernetesError(
                "the master pod was replaced and its journal was in the pod (no shared "
                "volume): a new master cannot take the job over, and would train it again "
                f"beside the pods that ran on ({', '.join(sorted(ours))}, now ended). Give "
                "shared_volume='pvc:CLAIM' (or 'hostPath:/dir' on a one-node cluster) for "
                "a job that survives the loss of its master pod."
            )
        raise KubernetesError(
            "an earlier master of this job ran, and the pods it started ran on "
            f"({', '.join(sorted(ours))}, now ended), but its journal {journal} is not on "
            f"the shared volume {self.spec.shared_volume!r} as this master pod sees it: a "
            "hostPath volume is one node's, and this pod may run on another node, or the "
            "job directory was removed. The job cannot be taken over; starting it again "
            "beside those pods would train twice. Fix: a shared volume every node mounts "
            "alike (shared_volume='pvc:CLAIM', ReadWriteMany)."
        )

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
