"""The Kubernetes backend: a job's master, workers and PS as pods (see the package
docstring for how the pieces fit)."""

from __future__ import annotations

import os
from pathlib import Path

from elasticdl_nb.backends.backend import Backend, FoundJob, MasterLink
from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.spec import JobSpec


class KubernetesBackend(Backend):
    name = "kubernetes"
    can_dry_run = True

    def submit(self, spec: JobSpec, record: JobRecord) -> None:
        from elasticdl_nb.backends.kubernetes.submit import start_job

        start_job(spec, record)

    def complete(self, spec: JobSpec) -> None:
        """A notebook in a pod (JupyterHub, Kubeflow) runs as its user's uid: the job's
        pods run as that uid and gid too, so that the job's directory on the shared
        volume, which its master makes owner-only then, is that user's alone."""
        from elasticdl_nb.backends.kubernetes.api import in_a_pod

        if not spec.run_as and in_a_pod() and os.getuid() != 0:
            spec.run_as = f"{os.getuid()}:{os.getgid()}"

    def dry_run(self, spec: JobSpec, record: JobRecord) -> str:
        from elasticdl_nb.backends.kubernetes.dry_run import dry_run_yaml

        return dry_run_yaml(spec, record.name, record.dir)

    def link(self, record: JobRecord) -> MasterLink:
        from elasticdl_nb.backends.kubernetes.master_link import KubernetesMasterLink

        return KubernetesMasterLink(record)

    def master_site(self, spec: JobSpec, job_dir: Path):
        from elasticdl_nb.backends.kubernetes.master_site import KubernetesSite

        return KubernetesSite(spec, spec.name, job_dir)

    def find_jobs(self, namespace: str, kubeconfig: str = "") -> list[FoundJob]:
        from elasticdl_nb.backends.kubernetes.find import list_jobs

        return list_jobs(namespace, kubeconfig, backend=self.name)

    def find_job(self, name: str, namespace: str, kubeconfig: str = "") -> JobRecord | None:
        from elasticdl_nb.backends.kubernetes.find import record_for

        return record_for(name, namespace, kubeconfig, backend=self.name)
