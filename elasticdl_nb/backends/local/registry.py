"""Where jobs live on disk, so that `attach` finds a job again from any process.

Each job is a directory `$ELASTICDL_NB_HOME/jobs/<name>/` (default home:
`~/.elasticdl-nb`), readable only by its owner because it holds the job's token:

    job.json      name, backend, creation time, token (and, for a Kubernetes job, where
                  it runs: namespace, kubeconfig, the master's address)
    spec.json     the JobSpec            sources.json  resolved data sources
    bundle/       the model bundle       master.json   master address and pid (when up)
    state.json    the final state, written by the master when the job ends
    events.jsonl  the event journal      logs/         one log per process
    checkpoints/  PS checkpoints         model.keras   the exported model
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOME_ENV = "ELASTICDL_NB_HOME"


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".elasticdl-nb")


def jobs_root() -> Path:
    return home() / "jobs"


def write_json(path: Path, value: Any, private: bool = False) -> None:
    """Write JSON atomically (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as out:
        json.dump(value, out, indent=1)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@dataclass(frozen=True)
class JobRecord:
    name: str
    dir: Path
    token: str
    created: float
    backend: str = "local"
    where: dict[str, Any] = field(default_factory=dict)  # backend-specific: see job.json

    @property
    def master(self) -> dict | None:
        """{'address', 'pid'} once the master is serving."""
        return read_json(self.dir / "master.json")

    @property
    def final_state(self) -> dict | None:
        """{'state', 'error', 'ended', ...} once the job has ended."""
        return read_json(self.dir / "state.json")

    def master_alive(self) -> bool:
        master = self.master
        if not master:
            return False
        try:
            os.kill(master["pid"], 0)
        except (ProcessLookupError, PermissionError):
            return False
        # A pid can be reused: the master's command line names the job directory.
        try:
            cmdline = Path(f"/proc/{master['pid']}/cmdline").read_bytes()
        except OSError:
            return False
        return b"elasticdl_nb.runtime.master" in cmdline


def create_job(name: str, backend: str = "local") -> JobRecord:
    root = jobs_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_dir = root / name
    try:
        job_dir.mkdir(mode=0o700)
    except FileExistsError:
        raise ValueError(
            f"A job named {name!r} already exists ({job_dir}). Choose another "
            "name, or attach to it with elasticdl_nb.attach(name)."
        ) from None
    record = JobRecord(name, job_dir, secrets.token_urlsafe(32), time.time(), backend)
    save_record(record)
    return record


def save_record(record: JobRecord) -> None:
    info = {"name": record.name, "backend": record.backend, "token": record.token}
    info.update(created=record.created, where=record.where)
    write_json(record.dir / "job.json", info, private=True)


def find_job(name: str) -> JobRecord | None:
    info = read_json(jobs_root() / name / "job.json")
    if info is None:
        return None
    return JobRecord(
        info["name"],
        jobs_root() / name,
        info["token"],
        info["created"],
        info.get("backend", "local"),
        info.get("where") or {},
    )


def all_jobs() -> list[JobRecord]:
    root = jobs_root()
    if not root.exists():
        return []
    records = [find_job(p.name) for p in root.iterdir() if p.is_dir()]
    return sorted((r for r in records if r), key=lambda r: r.created)
