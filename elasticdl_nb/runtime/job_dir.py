"""The job directory: the one folder every process of a job and every reader of it
shares. Its layout is written here and nowhere else:

    job.json      name, backend, creation time, token (and, for a Kubernetes job, where
                  it runs: namespace, kubeconfig, the master's address); owner-only
    spec.json     the JobSpec            sources.json  resolved data sources
    bundle/       the model bundle       master.json   master address and pid (when up),
                                         and its supervisor's pid (a local job)
    data/         notebook arrays staged for the job
    state.json    the final state, written by the master when the job ends
    events.jsonl  the event journal (since its newest compaction)
    events-history.jsonl  what the journal kept of the events before it
    master.snapshot  the master's state the compaction stood for (master/snapshot.py)
    logs/         one log per process
    checkpoints/  PS checkpoints         model.keras   the exported model
                                         model.not-exported  why it is not (tables too
                                         large for one file)
    saved_model/  the exported TensorFlow SavedModel (export_format saved_model or both)
                  saved_model.not-exported  why it is not
    tensorboard/  TensorBoard event files written from the journal (`tensorboard`)
    replicas/     what each allreduce replica applied (the exactly-once record)
    tls/          the job's certificates and keys (protocol/tls.py), owner-only, when the
                  job has TLS: every name's for a local job; for a Kubernetes job, the
                  notebook's only (the rest went into the job's Secret)

JSON files are written atomically (readers never see half a file).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import Role

# The process of a local job that runs its master and its workers and PS (not a Role: it
# takes no part in training), logging to `supervisor.log`.
SUPERVISOR = "supervisor"


@dataclass(frozen=True)
class JobDir:
    path: Path

    @property
    def record(self) -> Path:
        return self.path / "job.json"

    @property
    def spec(self) -> Path:
        return self.path / "spec.json"

    def read_spec(self) -> JobSpec:
        """The job's JobSpec: the one reader of `spec.json` (OSError while there is none,
        SpecError when it does not hold a valid spec)."""
        return JobSpec.from_json(self.spec.read_text())

    @property
    def sources(self) -> Path:
        return self.path / "sources.json"

    @property
    def bundle(self) -> Path:
        return self.path / "bundle"

    @property
    def data(self) -> Path:
        return self.path / "data"

    @property
    def tls(self) -> Path:
        return self.path / "tls"

    @property
    def master(self) -> Path:
        return self.path / "master.json"

    @property
    def master_lock(self) -> Path:
        """Held by a local job's master for its life (backends/local/master_site.py)."""
        return self.path / "master.lock"

    @property
    def state(self) -> Path:
        return self.path / "state.json"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def events_history(self) -> Path:
        return self.path / "events-history.jsonl"

    @property
    def master_snapshot(self) -> Path:
        return self.path / "master.snapshot"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def replicas(self) -> Path:
        return self.path / "replicas"

    @property
    def model(self) -> Path:
        return self.path / "model.keras"

    @property
    def model_not_exported(self) -> Path:
        return not_exported_note(self.model)

    @property
    def saved_model(self) -> Path:
        return self.path / "saved_model"

    @property
    def saved_model_not_exported(self) -> Path:
        return not_exported_note(self.saved_model)

    @property
    def predictions(self) -> Path:
        """The prediction tasks' outputs, a file per task (`runtime/predictions.py`)."""
        return self.path / "predictions"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    def log(self, role: str, index: int = 0) -> Path:
        """The log of one process: `master.log`, `supervisor.log`, `worker-3.log`, `ps-0.log`."""
        name = role if role in (Role.MASTER, SUPERVISOR) else f"{role}-{index}"
        return self.logs / f"{name}.log"

    def log_tail(self, role: str, index: int = 0, lines: int = 30) -> str:
        return log_tail(self.log(role, index), lines)


def not_exported_note(model: Path) -> Path:
    """Where the note that says why there is no model at `model` goes: `model.not-exported`
    for `model.keras`, `saved_model.not-exported` for `saved_model/`."""
    return model.with_name(f"{model.name.split('.')[0]}.not-exported")


def write_json(path: Path, value: Any, private: bool = False) -> None:
    """Write JSON atomically: to a temporary file beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as out:
        json.dump(value, out, indent=1)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """The file's JSON, or None while it does not exist (or is being replaced)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, or '(no log)'."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
