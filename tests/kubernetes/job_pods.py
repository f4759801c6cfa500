"""A job's pods as the Kubernetes tests see them: the options that put a job on the real
node's cluster, and its pods by role."""

from __future__ import annotations

import time

# Requests that let a master, a PS and three workers share the node's two cores; memory
# is also each pod's cgroup limit, with room for TensorFlow (a worker's RSS is ~500 MB).
SMALL = "cpu=100m,memory=1Gi"


def close_forward(job) -> None:
    """The notebook's port-forward to a job's master closed: before the API server goes
    at the session's end (or a test lays the cluster out again)."""
    if job._link._forward is not None:
        job._link._forward.close()


def k8s_options(cluster, namespace: str, tmp_path) -> dict:
    """The JobSpec options of a job in `namespace`, submitted as the notebook's user, on
    a hostPath shared volume in `tmp_path`."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # hostPath ignores fsGroup: the pods' uid 1000 must write here
    return dict(
        backend="kubernetes",
        namespace=namespace,
        kubeconfig=str(cluster.user_kubeconfig),
        shared_volume=f"hostPath:{shared}",
        master_resources=SMALL,
        ps_resources=SMALL,
        worker_resources=SMALL,
    )


def claim_on_node(admin, namespace: str, tmp_path) -> str:
    """A PersistentVolumeClaim in `namespace`, bound to a hostPath volume in `tmp_path`
    made for it: a job on it (`shared_volume="pvc:<claim>"`) keeps its files where the
    notebook does not look, as on a cluster whose storage the notebook cannot mount."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    where = tmp_path / "claimed"
    where.mkdir()
    where.chmod(0o777)  # hostPath ignores fsGroup: the pods' uid 1000 must write here
    volume = f"{namespace}-jobs"
    size = {"storage": "1Gi"}
    core.create_persistent_volume(
        {
            "metadata": {"name": volume},
            "spec": {
                "capacity": size,
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "manual",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(where), "type": "Directory"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "jobs"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "manual",
                "volumeName": volume,
                "resources": {"requests": size},
            },
        },
    )

    def bound():
        claim = core.read_namespaced_persistent_volume_claim("jobs", namespace)
        return claim.status.phase == "Bound"

    deadline = time.monotonic() + 60
    while not bound():
        assert time.monotonic() < deadline, "the claim did not bind in 60 s"
        time.sleep(0.2)
    return "jobs"


def pods(core, namespace: str, role: str | None = None) -> dict[str, object]:
    selector = "elasticdl-nb/job" + (f",elasticdl-nb/role={role}" if role else "")
    return {
        p.metadata.name: p
        for p in core.list_namespaced_pod(namespace, label_selector=selector).items
    }


def running_pod(core, namespace: str, role: str, spare: set[str] = frozenset()):
    """A running pod of the role, not being deleted and not in `spare` (there is one
    while the job trains)."""
    live = [
        name
        for name, p in pods(core, namespace, role).items()
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp and name not in spare
    ]
    return live[0] if live else None
