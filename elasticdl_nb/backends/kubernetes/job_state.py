"""What a Kubernetes job is now, decided in one place from what the cluster and the job's
volume show: the master's Job, its current master pod, and the job directory where this
machine sees it. `Job.status()` (through `KubernetesMasterLink`) and `jobs(namespace=)`
(`find.list_jobs`) both take a job's state from `job_state`, so they agree at every moment.

In order, the first that holds:
- the end is recorded: the job directory's final state (the master writes it last, then
  exits), else the master pod's termination message (the same JSON, for where the volume
  is not visible here): that state;
- the master pod runs and is ready (its gRPC port accepts): running, and only then is the
  master asked anything;
- the Job is gone, or failed (the master failed more often than its backoffLimit): lost;
- the Job completed, or its master pod succeeded, but its end cannot be read here (the
  pod is gone and the volume is not here): ended;
- else starting: a master pod being scheduled, pulling its image or starting to serve, or
  a new one coming (with why it is stuck, when the pod says).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import created
from elasticdl_nb.backends.kubernetes.pod_events import waiting_reason
from elasticdl_nb.runtime.job_dir import JobDir, read_json
from elasticdl_nb.vocabulary import JobState


@dataclass(frozen=True)
class Reading:
    """A job's state, and what goes with it: `final`, the status it ended with (an end
    state: what the master recorded, or a stand-in saying why it cannot be read); `why`,
    what a lost job lost, or what a starting one waits for ('' if nothing is known)."""

    state: JobState
    final: dict[str, Any] | None = None
    why: str = ""


def job_state(
    name: str, namespace: str, job: dict | None, pod: dict | None, files: Path | None
) -> Reading:
    """The state of job `name` in `namespace` from its master's Job (None: there is
    none), its current master pod (`current_pod`; None while there is none) and its job
    directory as this machine sees it (None where it does not)."""
    final = (read_json(JobDir(files).state) if files else None) or _termination_message(pod)
    if final:
        return Reading(JobState(final["state"]), final)
    if _serving(pod):
        return Reading(JobState.RUNNING)
    lost = _lost(name, namespace, job)
    if lost:
        return Reading(JobState.LOST, why=lost)
    if _condition(job, "Complete") or _phase(pod) == "Succeeded":
        why = (
            f"its master ended, but its end is recorded neither on a volume visible here nor "
            f"in its pod's termination message (is the pod gone?); see "
            f"`kubectl logs -n {namespace} -l {m.master_selector(name)}`"
        )
        return Reading(JobState.ENDED, {"name": name, "state": JobState.ENDED, "error": why})
    return Reading(JobState.STARTING, why=waiting_reason(pod) if pod else "")


def current_pod(pods: list[dict]) -> dict | None:
    """Of a job's master pods, the one that counts now: the newest not being deleted, else
    the newest (None when there is none)."""
    if not pods:
        return None
    return max(pods, key=lambda p: (not p["metadata"].get("deletionTimestamp"), created(p)))


def job_dir_here(host_dir: str, name: str) -> Path | None:
    """Job `name`'s directory on a hostPath shared volume at `host_dir`, if this machine
    sees it: the directory exists here when the notebook runs on the node (a local test
    cluster, kind or minikube with the directory mounted)."""
    return Path(host_dir) / name if Path(host_dir).is_dir() else None


def job_dir_of(job: dict, name: str) -> Path | None:
    """`job_dir_here` for the hostPath shared volume of the master's Job's pods, if any."""
    volumes = ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes")
    for volume in volumes or []:
        if volume.get("name") == m.JOB_VOLUME and volume.get("hostPath"):
            return job_dir_here(volume["hostPath"]["path"], name)
    return None


def _termination_message(pod: dict | None) -> dict | None:
    """The final status in the master container's termination message, if it has ended
    with one. (lastState: a master that recorded the end and then failed, before its
    restart finds the end recorded and exits.)"""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    for when in ("state", "lastState"):
        message = ((statuses[0].get(when) or {}).get("terminated") or {}).get("message")
        if message:
            try:
                return json.loads(message)
            except ValueError:
                return None
    return None


def _serving(pod: dict | None) -> bool:
    status = (pod or {}).get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return status.get("phase") == "Running" and ready


def _lost(name: str, namespace: str, job: dict | None) -> str:
    """Why the job is gone without an end state ('' unless it is): its Job deleted, or
    failed (the master failed more often than the Job's backoffLimit)."""
    job_name = m.master_name(name)
    if job is None:
        return (
            f"its Job {job_name} is gone (deleted?) without an end state; the job's other "
            "objects went with it"
        )
    failed = _condition(job, "Failed")
    if failed:
        why = failed.get("message") or failed.get("reason") or "failed"
        return (
            f"its master's Job {job_name} failed without an end state ({why}); see "
            f"`kubectl logs -n {namespace} -l {m.master_selector(name)}` --previous"
        )
    return ""


def _condition(job: dict | None, kind: str) -> dict | None:
    """The Job's condition of type `kind` ('Complete', 'Failed') if it holds."""
    for condition in ((job or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _phase(pod: dict | None) -> str | None:
    return ((pod or {}).get("status") or {}).get("phase")
