"""Start a Kubernetes job from the notebook: its master's Job, Service, ConfigMap and Secret
(the token and the job's TLS files, made here: protocol/tls.py).

The Job comes first, and the other three are owned by it, so deleting the Job deletes the
whole job (its pod waits for the ConfigMap and Secret, as every pod does for the volumes
and variables it names). All or nothing: if the server refuses an object, the Job is
deleted again and takes what was made with it. The checks that need no server (the
files fit a ConfigMap, a shared volume is named) come first; then the API server admits
the master pod in a dry run, because the Job controller makes the pod later, where a
refusal (a missing service account or priority class, a full quota) would be no more
than an event on the Job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elasticdl_nb.backends.job_records import JobRecord, save_record
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, client_for
from elasticdl_nb.backends.kubernetes.local_view import local_view
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.protocol import tls
from elasticdl_nb.spec import JobSpec, SpecError

# A ConfigMap's data is capped at 1 MiB by the API server (etcd's object size).
CONFIGMAP_LIMIT = 1024 * 1024


def job_objects(
    spec: JobSpec, name: str, job_dir: Path, token: str, tls_files: dict[str, str]
) -> list[dict[str, Any]]:
    """The four objects, the master's Job first; the Secret holds `token` and
    `tls_files`."""
    files = m.bundle_files(spec, name, job_dir)
    size = sum(len(v) for v in files.values())
    if size > CONFIGMAP_LIMIT:
        biggest = sorted(files.items(), key=lambda kv: -len(kv[1]))[:3]
        listed = ", ".join(f"{path} {len(data) / 2**20:.2f} MB" for path, data in biggest)
        raise KubernetesError(
            f"The job's files take {size / 2**20:.2f} MB, more than a ConfigMap holds "
            f"(1 MiB); largest: {listed}. Fix: put large data in files on the shared "
            "volume and pass their paths (data=), capture less by value (load big files "
            "inside the model functions), or put the model in a model-zoo module on the "
            "shared volume (model_zoo=)."
        )
    return [
        m.master_job(spec, name, list(files)),
        m.master_service(spec, name),
        m.bundle_configmap(spec, name, files),
        m.token_secret(spec, name, token, tls_files),
    ]


def submit(spec: JobSpec, name: str, job_dir: Path, token: str, api_client=None) -> dict[str, dict]:
    """Create the job's objects; returns what the server made, by kind ('Job': the
    master's Job, 'Service': its Service, ...)."""
    from kubernetes import client

    if not spec.shared_volume:
        raise SpecError(
            "A Kubernetes job needs shared_volume= ('pvc:CLAIM' or 'hostPath:/dir'): its "
            "checkpoints, journal and exported model must outlive any one pod."
        )
    # The job's TLS files: made here, kept in its Secret; of the keys only the notebook's
    # own is written on this machine (to reach the master), once the job is created.
    issued = tls.issue(tls.job_names(spec.parameter_servers), name)
    objects = job_objects(spec, name, job_dir, token, {f: d.decode() for f, d in issued.items()})
    api_client = api_client or client_for(spec.kubeconfig)
    api, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    template = objects[0]["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": m.master_name(name)},
        "spec": template["spec"],
    }
    call(
        f"create Pod {pod['metadata']['name']} in namespace {spec.namespace!r}",
        api.create_namespaced_pod,
        spec.namespace,
        pod,
        dry_run="All",  # admission only: the Job controller makes the real one
    )
    create = {
        "Job": batch.create_namespaced_job,
        "ConfigMap": api.create_namespaced_config_map,
        "Secret": api.create_namespaced_secret,
        "Service": api.create_namespaced_service,
    }
    made: dict[str, dict] = {}
    for obj in objects:
        kind, obj_name = obj["kind"], obj["metadata"]["name"]
        if "Job" in made:
            uid = made["Job"]["metadata"]["uid"]
            obj["metadata"]["ownerReferences"] = [m.owner_reference(m.master_name(name), uid)]
        what = f"create {kind} {obj_name} in namespace {spec.namespace!r}"
        try:
            made[kind] = call(what, create[kind], spec.namespace, obj)
        except KubernetesError:
            if "Job" in made:  # the rest goes with it (garbage collection)
                delete_job(batch, name, spec.namespace, quietly=True)
            raise
    tls.write(JobDir(job_dir).tls, {f: issued[f] for f in tls.files_of(tls.NOTEBOOK)})
    return made


def delete_job(batch, name: str, namespace: str, quietly: bool = False) -> None:
    """Delete the master's Job of job `name`, and so (garbage collection) every object
    of the job. `Background`: the API's default for a batch/v1 Job is to orphan its
    pods, which would leave the master running."""
    try:
        call(
            f"delete Job {m.master_name(name)}",
            batch.delete_namespaced_job,
            m.master_name(name),
            namespace,
            propagation_policy="Background",
            allow=(404,),
        )
    except KubernetesError:
        if not quietly:
            raise  # (quietly: the first error is the one to report)


def start_job(spec: JobSpec, record: JobRecord) -> None:
    """Submit a job prepared in `record.dir` (a `JobRecord`) and note in its
    record where it runs, so that `Job` and `attach` reach it."""
    made = submit(spec, record.name, record.dir, record.token)
    ip = made["Service"]["spec"]["clusterIP"]
    record.where.update(
        namespace=spec.namespace,
        kubeconfig=spec.kubeconfig,
        master_address=f"{ip}:{m.MASTER_PORT}",
        files=str(local_view(spec, record.name) or ""),
    )
    save_record(record)
