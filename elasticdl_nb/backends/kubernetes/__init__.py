"""The Kubernetes backend: the job's processes as pods (so far: the manifests and
`--dry-run`; launching, watching and the test cluster come next)."""

from elasticdl_nb.backends.kubernetes.dry_run import dry_run_yaml

__all__ = ["dry_run_yaml"]
