"""A job as the sidebar shows it: one small JSON object, the job's `JobView` summary (the
one fold of its journal, `elasticdl_nb.sdk.view`) with the state and what the job is
waiting for from `Job.status()`, which alone knows a job whose master is not up yet or is
lost; or, for a Kubernetes job only its namespace knows, what `jobs()` says of it.

The server keeps one view per job between requests (`JobViews`): each look folds only
the events since the last one, and a job that has ended is not read again."""

from __future__ import annotations

import threading
from typing import Any

from elasticdl_nb.sdk import Job
from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.vocabulary import FINAL_STATES, JobState


class JobViews:
    """The views of the jobs this server was asked about, by job (name and creation
    time: a job made again under the same name gets a new view). Thread-safe: handlers
    run their SDK calls in threads."""

    def __init__(self) -> None:
        self._views: dict[tuple[str, float], JobView] = {}
        self._locks: dict[tuple[str, float], threading.Lock] = {}
        self._read_to_the_end: set[tuple[str, float]] = set()
        self._lock = threading.Lock()

    def of(self, job: Job, state: str) -> JobView:
        """`job`'s view, caught up with its journal, given the job's `state` as its status
        says: a job still starting has no journal to read yet, and one whose state is
        final is read once more after that, then no more (a lost job's journal has no end
        of its own)."""
        key = (job.name, job.created)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            view = self._views.get(key)
            if view is None:
                view = self._views[key] = JobView.for_job(job)
            if state != JobState.STARTING and key not in self._read_to_the_end:
                view.catch_up(job)
                if state in FINAL_STATES or view.ended:
                    self._read_to_the_end.add(key)
            return view

    def keep_only(self, jobs: list[Job]) -> None:
        """Forget the views of jobs no longer listed (deleted)."""
        listed = {(job.name, job.created) for job in jobs}
        with self._lock:
            for key in set(self._views) - listed:
                self._views.pop(key, None)
                self._locks.pop(key, None)
                self._read_to_the_end.discard(key)


VIEWS = JobViews()


def job_summary(job: Job, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """Name, backend, state, creation time (Unix seconds), progress (with `fraction` done,
    0..1), live and desired workers, PS count, the newest evaluation, the master's goodput
    (None before the first minibatch), how many times its master was replaced
    (`master_restarts`) and the stragglers; `error` and `waiting` when there are."""
    status = job.status() if status is None else status
    return _summary(job, status, VIEWS.of(job, status.get("state", "unknown")))


def _summary(job: Job, status: dict[str, Any], view: JobView) -> dict[str, Any]:
    return {
        **view.summary(),
        "name": job.name,
        "backend": job.backend,
        "state": status.get("state", "unknown"),
        "error": status.get("error") or "",
        "waiting": status.get("waiting") or "",
        "created": job.created,
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
    """The summary, plus every instance (role, id, state, pid, exit code, signal, reason,
    restarts) as the journal last described it."""
    status = job.status()
    view = VIEWS.of(job, status.get("state", "unknown"))
    instances = [vars(row).copy() for row in view.rows()]
    return {**_summary(job, status, view), "instances": instances}
