"""A job as the sidebar shows it: one small JSON object built from `Job.status()`."""

from __future__ import annotations

from typing import Any

from elasticdl_nb.sdk.job import Job


def job_summary(job: Job, created: float, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """Name, backend, state, progress (with `fraction` done, 0..1), worker and PS counts."""
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
        "created": created,
        "progress": {
            "epoch": status.get("epoch", 0),
            "epochs": epochs,
            "step": status.get("step", 0),
            "fraction": 1.0 if state == "succeeded" else min(1.0, fraction),
            "records_per_second": status.get("records_per_second", 0.0),
        },
        "workers": {"live": status.get("workers", 0), "desired": status.get("desired_workers", 0)},
        "ps": status.get("ps", 0),
        "metrics": status.get("metrics") or {},
    }


def job_detail(job: Job, created: float) -> dict[str, Any]:
    """The summary, plus every instance (role, id, state, pid, exit reason)."""
    status = job.status()
    return {**job_summary(job, created, status), "instances": status.get("instances", [])}
