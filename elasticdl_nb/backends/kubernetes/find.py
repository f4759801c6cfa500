"""Finding Kubernetes jobs by label, for `attach` and `jobs` from a notebook other than
the one that started them: the master pod says the job exists, its Secret holds the token,
its Service the address, its ConfigMap the spec (for the shared volume)."""

from __future__ import annotations

import base64
from datetime import datetime
from pathlib import Path

from elasticdl_nb.backends import job_records
from elasticdl_nb.backends.backend import FoundJob
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import call, client_for
from elasticdl_nb.backends.kubernetes.backend import KubernetesBackend
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.vocabulary import JobState

# What a job whose master pod is in this phase is (the pod's phase says no more than that).
_STATE_OF_PHASE = {"Pending": JobState.STARTING, "Running": JobState.RUNNING}


def _core(kubeconfig: str):
    from kubernetes import client

    return client.CoreV1Api(client_for(kubeconfig))


def list_jobs(namespace: str, kubeconfig: str = "") -> list[FoundJob]:
    """Every job in the namespace, as its master pod says."""
    selector = f"{m.LABEL_ROLE}=master"
    pods = call(
        f"list jobs in namespace {namespace!r}",
        _core(kubeconfig).list_namespaced_pod,
        namespace,
        label_selector=selector,
    )
    return [
        FoundJob(
            name=pod["metadata"]["labels"][m.LABEL_JOB],
            backend=KubernetesBackend.name,
            state=_STATE_OF_PHASE.get((pod.get("status") or {}).get("phase"), JobState.ENDED),
            created=_seconds(pod["metadata"].get("creationTimestamp")),
        )
        for pod in pods.get("items", [])
    ]


def _seconds(timestamp: str | None) -> float | None:
    """An RFC 3339 time, as Kubernetes writes them, in Unix seconds."""
    try:
        return datetime.fromisoformat(timestamp).timestamp() if timestamp else None
    except ValueError:
        return None


def record_for(name: str, namespace: str, kubeconfig: str = "") -> job_records.JobRecord | None:
    """A local record of the cluster's job `name` (made now, so `Job` can reach it), or
    None if the namespace has no such job."""
    core = _core(kubeconfig)
    pod = call(
        f"read pod {m.master_name(name)}",
        core.read_namespaced_pod,
        m.master_name(name),
        namespace,
        allow=(404,),
    )
    if pod is None or (pod["metadata"].get("labels") or {}).get(m.LABEL_JOB) != name:
        return None
    secret = call(f"read Secret {m.secret_name(name)}", core.read_namespaced_secret,
                  m.secret_name(name), namespace)  # fmt: skip
    service = call(f"read Service {m.master_name(name)}", core.read_namespaced_service,
                   m.master_name(name), namespace)  # fmt: skip
    bundle = call(f"read ConfigMap {m.configmap_name(name)}", core.read_namespaced_config_map,
                  m.configmap_name(name), namespace)  # fmt: skip
    from elasticdl_nb.backends.kubernetes.submit import local_view
    from elasticdl_nb.spec import JobSpec

    spec = JobSpec.from_json(bundle["data"][JobDir(Path()).spec.name])

    record = job_records.find_job(name) or job_records.create_job(name, KubernetesBackend.name)
    record = job_records.JobRecord(
        name,
        record.dir,
        base64.b64decode(secret["data"][m.TOKEN_KEY]).decode(),
        record.created,
        KubernetesBackend.name,
        {
            "namespace": namespace,
            "kubeconfig": kubeconfig,
            "master_address": f"{service['spec']['clusterIP']}:{m.MASTER_PORT}",
            "files": str(local_view(spec, name) or ""),
        },
    )
    job_records.save_record(record)
    return record
