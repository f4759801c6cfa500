"""A job's pods as the Kubernetes tests see them: the options that put a job on the test
cluster, and its pods by role."""

from __future__ import annotations


def k8s_options(cluster, namespace: str, tmp_path) -> dict:
    shared = tmp_path / "shared"
    shared.mkdir()
    return dict(
        backend="kubernetes",
        namespace=namespace,
        kubeconfig=str(cluster.user_kubeconfig),
        shared_volume=f"hostPath:{shared}",
    )


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
