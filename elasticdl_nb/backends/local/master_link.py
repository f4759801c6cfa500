"""How the notebook reaches a local job's master: the address it wrote into the job
directory (the same for every master of the job), whether the job's supervisor still runs
(it restarts a master that dies), and its process group to end the job by force."""

from __future__ import annotations

from pathlib import Path

from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.backends.local import submit
from elasticdl_nb.runtime.job_dir import SUPERVISOR


class LocalMasterLink:
    def __init__(self, record: JobRecord):
        self.record = record

    @property
    def files(self) -> Path:
        """Where the job's files (journal, logs, exported model) are read."""
        return self.record.dir

    def address(self) -> str | None:
        """The master's address while the job's processes run, else None. While a master
        that died is being replaced, the address is its successor's: calls wait for it."""
        master = self.record.master
        return master["address"] if master and self.record.master_alive() else None

    def final_state(self) -> dict | None:
        return self.record.final_state

    def waiting_reason(self) -> str:
        return ""  # a local master is serving within seconds, or has failed to start

    def lost_reason(self) -> str:
        """Why the job is gone without an end state ('' unless it is)."""
        if self.record.master is not None and not self.final_state() and self.address() is None:
            return (
                "the job's processes are gone without recording an end state (its "
                "supervisor was killed?); see job.logs('master') and "
                f"{self.record.files.log(SUPERVISOR)}"
            )
        return ""

    def kill(self, grace_seconds: float = 10.0) -> None:
        submit.kill_job(self.record, grace_seconds)

    def read_log(self, role: str, index: int, tail: int | None = None) -> None:
        return None  # a local job's logs are only its files
