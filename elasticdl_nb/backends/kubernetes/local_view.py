"""Where this machine sees a Kubernetes job's directory on its shared volume, if it does.

The notebook reads a job's files (its journal, metrics, logs, exported model) straight
from the volume where it can, and through the API server and the master where it cannot.
It can:

- for `hostPath:/dir`, where that directory exists here (a notebook on the node: a local
  test cluster, kind or minikube with the directory mounted);
- for `pvc:CLAIM`, where the notebook runs in a pod of the job's namespace that mounts
  the same claim (deploy/notebook.yaml does, as JupyterHub or Kubeflow can): the mount is
  found in the notebook's own pod, read once at submit or attach (the user Role may `get`
  pods).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, client_for
from elasticdl_nb.backends.kubernetes.job_state import job_dir_here
from elasticdl_nb.spec import JobSpec

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def local_view(spec: JobSpec, name: str) -> Path | None:
    """Job `name`'s directory as this machine sees it, None if it does not."""
    kind, _, where = spec.shared_volume.partition(":")
    if kind == "hostPath":
        return job_dir_here(where, name)
    if kind == "pvc":
        mount = claim_mount_here(where, spec.namespace, spec.kubeconfig)
        return mount / name if mount else None
    return None


def claim_mount_here(claim: str, namespace: str, kubeconfig: str = "") -> Path | None:
    """Where this process's pod mounts `claim` of `namespace` whole (not a subPath), if
    it runs in such a pod; None otherwise, or if its pod cannot be read."""
    try:
        own_namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    except OSError:  # not in a pod (or one without its service account's files)
        return None
    if own_namespace != namespace:  # a claim is its namespace's: another one is not ours
        return None
    pod_name = os.environ.get("HOSTNAME") or socket.gethostname()  # a pod's own name
    from kubernetes import client

    try:
        core = client.CoreV1Api(client_for(kubeconfig))
        pod = call(f"read this notebook's pod {pod_name}", core.read_namespaced_pod,
                   pod_name, namespace, allow=(403, 404))  # fmt: skip
    except KubernetesError:
        return None
    if pod is None:
        return None
    volumes = {
        v["name"]
        for v in pod["spec"].get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("claimName") == claim
    }
    for container in pod["spec"]["containers"]:
        for mount in container.get("volumeMounts") or []:
            path = Path(mount["mountPath"])
            if mount["name"] in volumes and not mount.get("subPath") and path.is_dir():
                return path
    return None
