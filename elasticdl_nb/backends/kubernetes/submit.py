"""Start a Kubernetes job from the notebook: its ConfigMap, Secret, master pod and Service.

All or nothing: if the server refuses one object, the ones already made are deleted
again, so a failed start leaves no half a job behind. The checks that need no server
(the bundle fits a ConfigMap) come before any call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, client_for
from elasticdl_nb.spec import JobSpec

# A ConfigMap's data is capped at 1 MiB by the API server (etcd's object size).
CONFIGMAP_LIMIT = 1024 * 1024


def job_objects(spec: JobSpec, name: str, job_dir: Path, token: str) -> list[dict[str, Any]]:
    files = m.bundle_files(job_dir)
    size = sum(len(v) for v in files.values())
    if size > CONFIGMAP_LIMIT:
        biggest = sorted(files.items(), key=lambda kv: -len(kv[1]))[:3]
        listed = ", ".join(f"{path} {len(data) / 2**20:.2f} MB" for path, data in biggest)
        raise KubernetesError(
            f"The job's files take {size / 2**20:.2f} MB, more than a ConfigMap holds "
            f"(1 MiB); largest: {listed}. Fix: capture less by value (load big files inside "
            "the model functions, pass large arrays as data), or put the model in a "
            "model-zoo module on a volume the pods mount (model_zoo=, pod_template=)."
        )
    return [
        m.bundle_configmap(spec, name, files),
        m.token_secret(spec, name, token),
        m.master_pod(spec, name, list(files)),
        m.master_service(spec, name),
    ]


def submit(spec: JobSpec, name: str, job_dir: Path, token: str, api_client=None) -> dict:
    """Create the job's four objects; returns the master pod as the server has it."""
    from kubernetes import client

    objects = job_objects(spec, name, job_dir, token)
    core = client.CoreV1Api(api_client or client_for(spec.kubeconfig))
    create = {
        "ConfigMap": core.create_namespaced_config_map,
        "Secret": core.create_namespaced_secret,
        "Pod": core.create_namespaced_pod,
        "Service": core.create_namespaced_service,
    }
    delete = {
        "ConfigMap": core.delete_namespaced_config_map,
        "Secret": core.delete_namespaced_secret,
        "Pod": core.delete_namespaced_pod,
        "Service": core.delete_namespaced_service,
    }
    made: list[dict[str, Any]] = []
    master: dict = {}
    try:
        for obj in objects:
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            what = f"create {kind} {obj_name} in namespace {spec.namespace!r}"
            answer = call(what, create[kind], spec.namespace, obj)
            made.append(obj)
            if kind == "Pod":
                master = answer
    except KubernetesError:
        for obj in reversed(made):  # leave no half a job behind
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            try:
                call(f"delete {kind}", delete[kind], obj_name, spec.namespace, allow=(404,))
            except KubernetesError:
                pass  # the first error is the one to report
        raise
    return master
