"""Where a local job's master stands: at an address that outlives it, with its workers
and PS started by the job's supervisor (see supervisor.py), so that a master that dies
can be replaced while they run on.

The master listens on a Unix socket file in the job directory, `master.sock`
(`master_address`): every master of the job takes the same path, so workers and PS keep
calling the address they were given and reach whichever master runs (gRPC removes the
file a dead master left before it binds), and two jobs never share one. The job
directory is its owner's only (0700), so no other user of the machine can connect to
the master, nor take its address while a master is being replaced and receive the token
of the workers that call it. Every other server binds what the OS gives it: each PS its
own port when it starts (it tells the master, and workers ask the master where the PS
are).

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

from elasticdl_nb.backends.job_records import HOME_ENV
from elasticdl_nb.backends.local.supervised import SupervisedProcesses
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.site import EventSink
from elasticdl_nb.runtime.protocol.channels import listen
from elasticdl_nb.runtime.protocol.tls import JobTls

log = logging.getLogger("elasticdl_nb.master")


MASTER_SOCKET = "master.sock"  # in the job directory
# A Unix socket's path holds at most 107 bytes (sun_path, and its NUL).
_UNIX_PATH_MAX = 107


def master_address(job_dir: Path) -> str:
    """The gRPC address of every master of the job in `job_dir`.

    Not an abstract Unix socket (as it was): those have no permissions, any local user
    can connect to one and read its name in /proc/net/unix, and bind it while a dead
    master's successor starts, then collect the job token from every worker and PS that
    calls the master (a token sent to whoever listens). A socket file inside the job
    directory (0700) is reachable, and takeable, by the job's owner only. Only where its
    path is too long for a Unix socket does the master fall back to an abstract name:
    the job token is then its only guard, as it is for a PS's loopback ports."""
    socket_path = Path(job_dir).resolve() / MASTER_SOCKET
    if len(os.fsencode(socket_path)) <= _UNIX_PATH_MAX:
        return f"unix:{socket_path}"
    log.warning(
        "the job directory's path is too long for the master's socket file (%s): the "
        "master listens on an abstract Unix socket, which other local users can reach "
        "(the job token still guards it); a shorter %s avoids it",
        socket_path,
        HOME_ENV,
    )
    digest = hashlib.sha256(str(socket_path.parent).encode()).hexdigest()
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
