"""A job as the sidebar shows it: one small JSON object built from `Job.status()`, or, for
a Kubernetes job only its namespace knows, from what `jobs()` says of it."""

from __future__ import annotations

from typing import Any

from elasticdl_nb.sdk import Job
from elasticdl_nb.vocabulary import JobState


def job_summary(job: Job, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """Name, backend, state, creation time (Unix seconds), progress (with `fraction` done,
    0..1), worker and PS counts, the master's goodput (None before the first minibatch)
    and how many times its master was replaced (`master_restarts`)."""
    status = job.status() if status is None else status
    state = status.get("state", "unknown")
    per_epoch = status.get("records_per_epoch") or 0
    epochs = status.get("epochs") or 0
    done = (status.get("epoch") or 0) * per_epoch + (status.get("records_done") or 0)
    fraction = done / (per_epoch * epochs) if per_epoch and epochs else 0.0
    return {
        "name": job.name,
        "backend": job.backend,
        "state": state,
        "error": status.get("error") or "",
        "waiting": status.get("waiting") or "",
        "created": job.created,
        "progress": {
            "epoch": status.get("epoch", 0),
            "epochs": epochs,
            "step": status.get("step", 0),
            "fraction": 1.0 if state == JobState.SUCCEEDED else min(1.0, fraction),
            "records_per_second": status.get("records_per_second", 0.0),
        },
        "workers": {"live": status.get("workers", 0), "desired": status.get("desired_workers", 0)},
        "ps": status.get("ps", 0),
        "metrics": status.get("metrics") or {},
        "goodput": status.get("goodput"),
        "master_restarts": status.get("master_restarts") or 0,
        "remote": False,
    }


def remote_summary(listed: dict[str, Any]) -> dict[str, Any]:
    """A job that only a Kubernetes namespace knows, as `jobs(namespace)` lists it: its
    state is all there is to say until someone attaches to it."""
    return {
        "name": listed["name"],
        "backend": listed["backend"],
        "state": listed["state"],
        **({} if listed.get("created") is None else {"created": listed["created"]}),
        "remote": True,
    }


def job_detail(job: Job) -> dict[str, Any]:
    """The summary, plus every instance (role, id, state, pid, exit reason)."""
    status = job.status()
    return {**job_summary(job, status), "instances": status.get("instances", [])}
