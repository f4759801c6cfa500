"""`Backend`: everything a client needs from where a job runs, in one interface.

A backend is found by name (`elasticdl_nb.backends.get_backend`); nothing else in the
package branches on which one it is. Beside it: `MasterLink`, how a client reaches a
job's master and reads its files, and `FoundJob`, a job the backend found that this
machine did not start. Inside the master process, the backend's `master_site` is the
runtime's plug (`runtime.master.site.MasterSite`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.runtime.master.site import MasterSite
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import JobState


class MasterLink(Protocol):
    """How a client reaches one job's master, and where it reads the job's files."""

    @property
    def files(self) -> Path:
        """The job directory as this machine sees it (journal, logs, exported model)."""
        ...

    def address(self) -> str | None:
        """The master's address while it runs, else None."""
        ...

    def final_state(self) -> dict[str, Any] | None:
        """The status the master recorded at the end, once there is one."""
        ...

    def waiting_reason(self) -> str:
        """Why the master is not serving yet ('' if nothing is known)."""
        ...

    def lost_reason(self) -> str:
        """Why the job is gone without an end state ('' unless it is)."""
        ...

    def kill(self, grace_seconds: float = 10.0) -> None:
        """End the job by force: its master and everything it started."""
        ...

    def read_log(self, role: str, index: int, tail: int | None = None) -> str | None:
        """A process's log from where the backend itself keeps it, for when `files` has
        none (the job's volume is not visible here); None when the backend has none."""
        ...


@dataclass(frozen=True)
class FoundJob:
    """A job found where a backend runs jobs, though this machine did not start it."""

    name: str
    backend: str
    state: JobState
    created: float | None  # Unix seconds, when the backend says


class Backend(ABC):
    """Where jobs run. One instance per process serves every job of that backend."""

    name: ClassVar[str]
    can_dry_run: ClassVar[bool] = False  # whether `dry_run` shows anything

    @abstractmethod
    def submit(self, spec: JobSpec, record: JobRecord) -> None:
        """Start the job prepared in `record.dir`: its master, which starts the rest.
        Returns once the master is on its way; raises (having left nothing running) if
        it cannot start."""

    def complete(self, spec: JobSpec) -> None:
        """Fill in the options whose defaults depend on where the notebook runs, before
        the spec is checked and written (nothing by default)."""
        del spec

    def dry_run(self, spec: JobSpec, record: JobRecord) -> str:
        """What the job would create, as text, without starting anything."""
        del record
        raise NotImplementedError(f"the {self.name} backend has no dry run")

    @abstractmethod
    def link(self, record: JobRecord) -> MasterLink:
        """How to reach the master of a job of this backend."""

    @abstractmethod
    def master_site(self, spec: JobSpec, job_dir: Path) -> MasterSite:
        """Where the master stands; called in the master process."""

    def find_jobs(self, namespace: str, kubeconfig: str = "") -> list[FoundJob]:
        """Jobs in `namespace` that this machine did not start (none by default)."""
        del namespace, kubeconfig
        return []

    def find_job(self, name: str, namespace: str, kubeconfig: str = "") -> JobRecord | None:
        """A record of job `name` in `namespace`, made now so a `Job` can reach it; None
        if there is none (or the backend has no namespaces)."""
        del name, namespace, kubeconfig
        return None
