"""Where a local job's master stands: on loopback, with its workers and PS as child
processes (see processes.py). Every server binds a port the OS gives it: the master its
own here, each PS its own when it starts (it tells the master, and workers ask the master
where the PS are), so no address is known before its server holds it."""

from __future__ import annotations

from pathlib import Path

from elasticdl_nb.backends.local.processes import LocalProcesses
from elasticdl_nb.runtime.master.site import EventSink
from elasticdl_nb.runtime.process_env import LOOPBACK
from elasticdl_nb.runtime.protocol.channels import listen


class LocalSite:
    def __init__(self, job_dir: Path):
        self.job_dir = job_dir
        self.ps_addrs: list[str] = []  # not fixed: each PS reports the port it bound

    def open(self) -> None:
        pass  # nothing to learn: every address is bound when its server starts

    def bind(self, server) -> str:
        """Listen on a loopback port the OS picks; returns the address to advertise."""
        return f"{LOOPBACK}:{listen(server, f'{LOOPBACK}:0')}"

    def launcher(self, env: dict[str, str], on_event: EventSink) -> LocalProcesses:
        return LocalProcesses(self.job_dir, env, on_event)

    def job_ended(self, status: dict) -> None:
        pass  # the job directory's state.json, which the master wrote, is all there is
