"""`--dry-run`: every object a Kubernetes job would create, as one YAML stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.runtime.protocol import tls
from elasticdl_nb.spec import JobSpec

# Values only known at launch, shown as what they are rather than invented.
TOKEN_PLACEHOLDER = "<generated at launch>"
JOB_UID_PLACEHOLDER = "<the master Job's uid>"


def job_manifests(spec: JobSpec, name: str, job_dir: Path) -> list[dict[str, Any]]:
    """The notebook's four objects (the master's Job first), then what the master
    creates at start: a pod and a Service per PS and the first `workers` worker pods."""
    from elasticdl_nb.backends.kubernetes.submit import job_objects

    owner = m.owner_reference(m.master_name(name), JOB_UID_PLACEHOLDER)
    names = tls.job_names(spec.parameter_servers)
    placeholders = {file: TOKEN_PLACEHOLDER for n in names for file in tls.files_of(n)}
    objects = job_objects(spec, name, job_dir, TOKEN_PLACEHOLDER, placeholders)
    for obj in objects[1:]:  # as submit() makes them: owned by the master's Job
        obj["metadata"]["ownerReferences"] = [owner]
    addresses = m.Addresses.service_dns(spec, name)
    for i in range(spec.parameter_servers):
        objects += [m.ps_pod(spec, name, i, owner, addresses), m.ps_service(spec, name, i, owner)]
    objects += [m.worker_pod(spec, name, i, owner, addresses) for i in range(spec.workers)]
    return objects


def dry_run_yaml(spec: JobSpec, name: str, job_dir: Path) -> str:
    import yaml

    header = (
        f"# elasticdl-nb --dry-run: the objects of job {name!r} in namespace "
        f"{spec.namespace!r}.\n# The first four are created from the notebook (the Job then "
        "makes the master's pod); the master creates the others (and their replacements).\n"
    )
    return header + yaml.safe_dump_all(job_manifests(spec, name, job_dir), sort_keys=False)
