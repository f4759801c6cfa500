"""The jobs this machine knows, whatever their backend: one directory per job under
`$ELASTICDL_NB_HOME/jobs/<name>/` (default home: `~/.elasticdl-nb`), readable only by its
owner because it holds the job's token. `attach` finds a job again from any process here.

A `JobRecord` is what `job.json` says (name, token, backend, and where a job of that
backend runs); the rest of the directory's layout is `runtime.job_dir.JobDir`.
"""

from __future__ import annotations

import os
import pwd
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.runtime.job_dir import JobDir, read_json, write_json
from elasticdl_nb.runtime.protocol import tls as job_tls

HOME_ENV = "ELASTICDL_NB_HOME"
# What a master process runs (`python -m ...`): the one entry point of every backend.
MASTER_MODULE = "elasticdl_nb.backends.master_process"
# What a local job's supervisor runs: the process that restarts a master that dies.
SUPERVISOR_MODULE = "elasticdl_nb.backends.local.supervisor"


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".elasticdl-nb")


def jobs_root() -> Path:
    return home() / "jobs"


@dataclass(frozen=True)
class JobRecord:
    name: str
    dir: Path
    token: str
    created: float
    backend: str = "local"
    where: dict[str, Any] = field(default_factory=dict)  # backend-specific: see job.json

    @property
    def files(self) -> JobDir:
        """The job directory as this machine holds it (for a Kubernetes job: what the
        notebook prepared; the running job's files are `MasterLink.files`)."""
        return JobDir(self.dir)

    @property
    def tls(self) -> job_tls.JobTls | None:
        """What the notebook reaches the job's master with when the job has TLS."""
        if not (self.files.tls / job_tls.cert_file(job_tls.NOTEBOOK)).exists():
            return None
        return job_tls.JobTls.load(self.files.tls, job_tls.NOTEBOOK)

    @property
    def master(self) -> dict | None:
        """{'address', 'pid', 'supervisor_pid'} once the master is serving (the last one
        that did; the supervisor's pid is None where there is no supervisor)."""
        return read_json(self.files.master)

    @property
    def final_state(self) -> dict | None:
        """{'state', 'error', 'ended', ...} once the job has ended."""
        return read_json(self.files.state)

    def master_alive(self) -> bool:
        """Whether the job's master serves on this machine, or may again: a local job's
        master is alive while its supervisor runs (it restarts a master that dies, in a
        second); without a supervisor, while the master process runs."""
        master = self.master
        if not master:
            return False
        if master.get("supervisor_pid"):
            return _runs(master["supervisor_pid"], SUPERVISOR_MODULE)
        return _runs(master["pid"], MASTER_MODULE)


def _runs(pid: int, module: str) -> bool:
    """Whether process `pid` runs `python -m module` (a pid can be reused: the command
    line tells ours from another; a zombie has none)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if not cmdline:  # a process on its way out loses its command line well before it
        return _exiting(pid)  # is gone: it still runs until then (seen in CI, stop())
    return module.encode() in cmdline


_PF_EXITING = 0x4  # the kernel's per-process flag: exit has begun


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, kernel flags) of `pid` from /proc/<pid>/stat; None if there is no
    such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[6])


def process_gone(pid: int) -> bool:
    """Whether `pid` has ended: no such process, or a zombie waiting to be reaped."""
    state = process_state(pid)
    return state is None or state[0] in ("Z", "X")


def _exiting(pid: int) -> bool:
    """Whether `pid` is exiting and not yet a zombie."""
    state = process_state(pid)
    return state is not None and not process_gone(pid) and bool(state[1] & _PF_EXITING)


class JobExists(ElasticDLError, ValueError):
    """A job of that name is known here already."""


class JobNotYours(ElasticDLError, PermissionError):
    """The job (or the jobs root) belongs to another user: its files are owner-only."""


def not_yours(path: Path) -> JobNotYours:
    """Why `path` (a job directory, or the jobs root) cannot be read from this account.
    Said in one paragraph rather than as the PermissionError from deep inside a read: on
    a machine shared by several users (a JupyterHub without Kubernetes runs every
    notebook server as its user), `ELASTICDL_NB_HOME` or a job name may lead to another
    user's jobs, and their files (the token first) are their owner's only."""
    whose = "it belongs to another user"
    # The nearest of it and the directories above it that can be looked at (a job
    # directory in another user's jobs root cannot even be stat'ed).
    for holder in (path, *path.parents):
        try:
            owner = holder.stat().st_uid
        except OSError:
            continue
        if owner != os.getuid():
            where = "it" if holder == path else f"{holder}, which holds it,"
            whose = f"{where} belongs to user {_user_name(owner)}"
        break
    return JobNotYours(
        f"Cannot open {path}: {whose}, and a job's files are readable by "
        f"the account that started it only (this is {_user_name(os.getuid())}). Open "
        f"the job from that account; {HOME_ENV} (here {home()}) must point at your own "
        "job home."
    )


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def create_job(name: str, backend: str = "local") -> JobRecord:
    root = jobs_root()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except PermissionError:
        raise not_yours(root) from None
    job_dir = root / name
    try:
        job_dir.mkdir(mode=0o700)
    except FileExistsError:
        raise JobExists(
            f"A job named {name!r} already exists ({job_dir}). Choose another "
            "name, or attach to it with elasticdl_nb.attach(name)."
        ) from None
    except PermissionError:
        raise not_yours(root) from None
    record = JobRecord(name, job_dir, secrets.token_urlsafe(32), time.time(), backend)
    save_record(record)
    return record


def issue_certificates(record: JobRecord, parameter_servers: int) -> None:
    """A new authority for the job, and a certificate for every name in it, into the
    job directory's tls/ (owner-only); the backend takes them from there."""
    names = job_tls.job_names(parameter_servers)
    job_tls.write(record.files.tls, job_tls.issue(names, record.name))


def save_record(record: JobRecord) -> None:
    info = {"name": record.name, "backend": record.backend, "token": record.token}
    info.update(created=record.created, where=record.where)
    write_json(record.files.record, info, private=True)


def find_job(name: str) -> JobRecord | None:
    """The job's record, None if there is no such job; `JobNotYours` if there is one
    this account may not read."""
    try:
        info = read_json(JobDir(jobs_root() / name).record)
    except PermissionError:
        raise not_yours(jobs_root() / name) from None
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
    """This account's jobs, oldest first; `JobNotYours` if the jobs root is another
    user's. A job directory in it that this account may not read is left out: listing
    shows only the jobs one may open."""
    root = jobs_root()
    try:
        if not root.exists():
            return []
        entries = [p for p in root.iterdir() if p.is_dir()]
    except PermissionError:
        raise not_yours(root) from None
    records = []
    for entry in entries:
        try:
            records.append(find_job(entry.name))
        except JobNotYours:
            continue
    return sorted((r for r in records if r), key=lambda r: r.created)
