"""Where a local job's master stands: at an address that outlives it, with its workers
and PS started by the job's supervisor (see supervisor.py), so that a master that dies
can be replaced while they run on.

The master listens on an abstract Unix socket named after the job directory
(`master_address`): every master of the job takes the same name, so workers and PS keep
calling the address they were given and reach whichever master runs. The kernel frees
the name when the process that held it dies, and two jobs never share one. Every other
server binds what the OS gives it: each PS its own port when it starts (it tells the
master, and workers ask the master where the PS are).

One master acts for a job at a time (the rule a Kubernetes job's masters keep with a
Lease, `backends/kubernetes/master_lease.py`): a local master holds an exclusive `flock`
on the job directory's `master.lock` from `open` on, before it reads the journal, and a
master that finds it taken waits. The kernel lets the lock go exactly when the process
that holds it dies (SIGKILL included, a SIGSTOP not), so a successor never acts beside a
predecessor that still runs, frozen or not. There is no lease to lose: the supervisor
and its masters share one machine, one clock and no network between them, so the fence
never closes on a living master (the supervisor starts the next master only once the
last one has exited; the lock also keeps out one started by anything else).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from pathlib import Path

from elasticdl_nb.backends.local.supervised import SupervisedProcesses
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.site import EventSink
from elasticdl_nb.runtime.protocol.channels import listen
from elasticdl_nb.runtime.protocol.tls import JobTls

log = logging.getLogger("elasticdl_nb.master")


def master_address(job_dir: Path) -> str:
    """The gRPC address of every master of the job in `job_dir`."""
    digest = hashlib.sha256(str(Path(job_dir).resolve()).encode()).hexdigest()
    return f"unix-abstract:elasticdl-nb-master-{digest[:24]}"


class _HeldForLife:
    """The local fence: the master lock is held until the process ends."""

    def check(self) -> None:
        pass


class LocalSite:
    def __init__(self, job_dir: Path):
        self.job_dir = job_dir
        self.ps_addrs: list[str] = []  # not fixed: each PS reports the port it bound
        self.fence = _HeldForLife()
        self._lock_fd: int | None = None

    def open(self) -> None:
        """Take the job's master lock, waiting while another master holds it. (Nothing
        else to learn: every address is bound when its server starts.)"""
        # Not inherited by children (PEP 446): the lock lives exactly as long as we do.
        fd = os.open(JobDir(self.job_dir).master_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("another master of this job still runs; waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
        self._lock_fd = fd

    def bind(self, server, tls: JobTls | None) -> str:
        """Listen at the job's master address; returns it."""
        address = master_address(self.job_dir)
        listen(server, address, tls)
        return address

    def launcher(self, env: dict[str, str], on_event: EventSink) -> SupervisedProcesses:
        return SupervisedProcesses(env, on_event)

    def job_ended(self, status: dict) -> None:
        pass  # the job directory's state.json, which the master wrote, is all there is
