"""Where a local job's master stands: at an address that outlives it, with its workers
and PS started by the job's supervisor (see supervisor.py), so that a master that dies
can be replaced while they run on.

The master listens on an abstract Unix socket named after the job directory
(`master_address`): every master of the job takes the same name, so workers and PS keep
calling the address they were given and reach whichever master runs. The kernel frees
the name when the process that held it dies, and two jobs never share one. Every other
server binds what the OS gives it: each PS its own port when it starts (it tells the
master, and workers ask the master where the PS are).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from elasticdl_nb.backends.local.supervised import SupervisedProcesses
from elasticdl_nb.runtime.master.site import EventSink
from elasticdl_nb.runtime.protocol.channels import listen
from elasticdl_nb.runtime.protocol.tls import JobTls


def master_address(job_dir: Path) -> str:
    """The gRPC address of every master of the job in `job_dir`."""
    digest = hashlib.sha256(str(Path(job_dir).resolve()).encode()).hexdigest()
    return f"unix-abstract:elasticdl-nb-master-{digest[:24]}"


class LocalSite:
    def __init__(self, job_dir: Path):
        self.job_dir = job_dir
        self.ps_addrs: list[str] = []  # not fixed: each PS reports the port it bound

    def open(self) -> None:
        pass  # nothing to learn: every address is bound when its server starts

    def bind(self, server, tls: JobTls | None) -> str:
        """Listen at the job's master address; returns it."""
        address = master_address(self.job_dir)
        listen(server, address, tls)
        return address

    def launcher(self, env: dict[str, str], on_event: EventSink) -> SupervisedProcesses:
        return SupervisedProcesses(env, on_event)

    def job_ended(self, status: dict) -> None:
        pass  # the job directory's state.json, which the master wrote, is all there is
