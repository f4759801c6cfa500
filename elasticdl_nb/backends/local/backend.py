"""The local backend: a job's master, workers and PS as processes on this machine."""

from __future__ import annotations

from pathlib import Path

from elasticdl_nb.backends.backend import Backend, MasterLink
from elasticdl_nb.backends.job_records import JobRecord, issue_certificates
from elasticdl_nb.backends.local.master_link import LocalMasterLink
from elasticdl_nb.backends.local.master_site import LocalSite
from elasticdl_nb.backends.local.submit import start_master
from elasticdl_nb.spec import JobSpec


class LocalBackend(Backend):
    name = "local"

    def submit(self, spec: JobSpec, record: JobRecord) -> None:
        if spec.tls:  # every name's certificate, in the (owner-only) job directory
            issue_certificates(record, spec.parameter_servers)
        start_master(record)

    def link(self, record: JobRecord) -> MasterLink:
        return LocalMasterLink(record)

    def master_site(self, spec: JobSpec, job_dir: Path) -> LocalSite:
        del spec
        return LocalSite(job_dir)
