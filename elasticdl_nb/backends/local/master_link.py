"""How the notebook reaches a local job's master: the address and pid it wrote into the
job directory, and its process group to end the job by force."""

from __future__ import annotations

from pathlib import Path

from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.backends.local import submit


class LocalMasterLink:
    def __init__(self, record: JobRecord):
        self.record = record

    @property
    def files(self) -> Path:
        """Where the job's files (journal, logs, exported model) are read."""
        return self.record.dir

    def address(self) -> str | None:
        """The master's address while it runs, else None."""
        master = self.record.master
        return master["address"] if master and self.record.master_alive() else None

    def final_state(self) -> dict | None:
        return self.record.final_state

    def waiting_reason(self) -> str:
        return ""  # a local master is serving within seconds, or has failed to start

    def lost_reason(self) -> str:
        """Why the job is gone without an end state ('' unless it is)."""
        if self.address() is None and self.record.master is not None:
            return (
                "the master process is gone without recording an end state (killed?); "
                "see job.logs('master')"
            )
        return ""

    def kill(self, grace_seconds: float = 10.0) -> None:
        submit.kill_job(self.record, grace_seconds)

    def read_log(self, role: str, index: int, tail: int | None = None) -> None:
        return None  # a local job's logs are only its files
