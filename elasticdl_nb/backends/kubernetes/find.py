"""Finding Kubernetes jobs by label, for `attach` and `jobs` from a notebook other than
the one that started them: the master's Job says the job exists (its current master pod
whether it runs), its Secret holds the token and the notebook's TLS files, its Service the
address, its ConfigMap the spec (for the shared volume).

The backend (`backend.KubernetesBackend`) calls these with its name (`backend`), which
the found jobs and records carry: this module does not import the backend, which
imports it."""

from __future__ import annotations

import base64
from pathlib import Path

from elasticdl_nb.backends import job_records
from elasticdl_nb.backends.backend import FoundJob
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import call, client_for, created
from elasticdl_nb.backends.kubernetes.job_state import current_pod, job_dir_of, job_state
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.protocol import tls


def _clients(kubeconfig: str):
    from kubernetes import client

    api_client = client_for(kubeconfig)
    return client.CoreV1Api(api_client), client.BatchV1Api(api_client)


def list_jobs(namespace: str, kubeconfig: str = "", *, backend: str) -> list[FoundJob]:
    """Every job in the namespace, in the state `job_state` reads from its master's Job,
    its current master pod and its files (where this machine sees its volume): the
    state its `Job.status()` says."""
    core, batch = _clients(kubeconfig)
    selector = f"{m.LABEL_ROLE}=master"
    where = f"list jobs in namespace {namespace!r}"
    jobs = call(where, batch.list_namespaced_job, namespace, label_selector=selector)
    pods = call(where, core.list_namespaced_pod, namespace, label_selector=selector)
    masters: dict[str, list[dict]] = {}
    for pod in pods.get("items", []):
        masters.setdefault(pod["metadata"]["labels"].get(m.LABEL_JOB, ""), []).append(pod)
    found = []
    for job in jobs.get("items", []):
        name = job["metadata"]["labels"][m.LABEL_JOB]
        pod = current_pod(masters.get(name, []))
        state = job_state(name, namespace, job, pod, job_dir_of(job, name)).state
        found.append(FoundJob(name, backend, state, created(job) or None))
    return found


def record_for(
    name: str, namespace: str, kubeconfig: str = "", *, backend: str
) -> job_records.JobRecord | None:
    """A local record of the cluster's job `name` (made now, so `Job` can reach it), or
    None if the namespace has no such job."""
    core, batch = _clients(kubeconfig)
    job = call(
        f"read Job {m.master_name(name)}",
        batch.read_namespaced_job,
        m.master_name(name),
        namespace,
        allow=(404,),
    )
    if job is None or (job["metadata"].get("labels") or {}).get(m.LABEL_JOB) != name:
        return None
    secret = call(f"read Secret {m.secret_name(name)}", core.read_namespaced_secret,
                  m.secret_name(name), namespace)  # fmt: skip
    service = call(f"read Service {m.master_name(name)}", core.read_namespaced_service,
                   m.master_name(name), namespace)  # fmt: skip
    bundle = call(f"read ConfigMap {m.configmap_name(name)}", core.read_namespaced_config_map,
                  m.configmap_name(name), namespace)  # fmt: skip
    from elasticdl_nb.backends.kubernetes.local_view import local_view
    from elasticdl_nb.spec import JobSpec

    spec = JobSpec.from_json(bundle["data"][JobDir(Path()).spec.name])

    record = job_records.find_job(name) or job_records.create_job(name, backend)
    record = job_records.JobRecord(
        name,
        record.dir,
        base64.b64decode(secret["data"][m.TOKEN_KEY]).decode(),
        record.created,
        backend,
        {
            "namespace": namespace,
            "kubeconfig": kubeconfig,
            "master_address": f"{service['spec']['clusterIP']}:{m.MASTER_PORT}",
            "files": str(local_view(spec, name) or ""),
        },
    )
    job_records.save_record(record)
    notebook_files = tls.files_of(tls.NOTEBOOK)
    if all(f in secret["data"] for f in notebook_files):  # (a job made before TLS has none)
        files = {f: base64.b64decode(secret["data"][f]) for f in notebook_files}
        tls.write(record.files.tls, files)
    return record
