"""What a job process (master, worker, PS) learns from its environment at start.

Backends set these variables when they launch a process; the token is never put on the
command line, where other local users could read it.

The PS addresses are set only where they are fixed before a PS starts (on Kubernetes, a
Service per PS); elsewhere each PS binds a port the OS gives it and tells the master, and
workers ask the master where the PS are (GetPsAddresses).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV, token_from_env
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.protocol.patience import Patience
from elasticdl_nb.runtime.protocol.tls import MASTER, JobTls

JOB_DIR_ENV = "ELASTICDL_NB_JOB_DIR"
MASTER_ENV = "ELASTICDL_NB_MASTER_ADDR"
PS_ENV = "ELASTICDL_NB_PS_ADDRS"
# Set on Kubernetes, where a process listens on its pod's IP (the downward API gives it)
# while others reach it at its Service's address, and where a Service must name every
# port, so the bulk channel cannot take whatever port the OS picks.
BIND_HOST_ENV = "ELASTICDL_NB_BIND_HOST"
BULK_PORT_ENV = "ELASTICDL_NB_BULK_PORT"
# The directory of the job's TLS files (protocol/tls.py): the job directory's tls/ for a
# local job, the Secret's volume in a pod. Unset: the job runs in plaintext.
TLS_DIR_ENV = "ELASTICDL_NB_TLS_DIR"
LOOPBACK = "127.0.0.1"

# How long a worker or PS keeps calling a master that does not answer (paused, busy, or
# being replaced after it died, at the same address) before it gives up: long enough for
# a loaded machine and a new master, short enough that a master that is really gone is
# noticed (locally the job's processes die with its supervisor anyway).
MASTER_PATIENCE = Patience(seconds=120)


@dataclass(frozen=True)
class ProcessEnv:
    token: str
    job_dir: Path
    master_addr: str
    ps_addrs: tuple[str, ...]
    bind_host: str = ""
    bulk_port: int = 0
    tls_dir: Path | None = None
    identity: str = ""  # the name this process's certificate answers to: "worker", "ps-0"

    @classmethod
    def from_environ(cls, identity: str) -> ProcessEnv:
        """What the backend set for this process, which answers to `identity`."""
        job_dir = os.environ.get(JOB_DIR_ENV)
        if not job_dir:
            raise SystemExit(f"{JOB_DIR_ENV} is not set: job processes are started by a backend")
        ps = os.environ.get(PS_ENV, "")
        return cls(
            token_from_env(),
            Path(job_dir),
            os.environ.get(MASTER_ENV, ""),
            tuple(a for a in ps.split(",") if a),
            os.environ.get(BIND_HOST_ENV, ""),
            int(os.environ.get(BULK_PORT_ENV) or 0),
            tls_dir_from_environ(),
            identity,
        )

    def to_environ(self) -> dict[str, str]:
        """What the processes this one starts (the master's workers and PS) are given."""
        env = {
            TOKEN_ENV: self.token,
            JOB_DIR_ENV: str(self.job_dir),
            MASTER_ENV: self.master_addr,
            PS_ENV: ",".join(self.ps_addrs),
        }
        if self.tls_dir is not None:
            env[TLS_DIR_ENV] = str(self.tls_dir)
        return env

    @cached_property
    def tls(self) -> JobTls | None:
        """This process's TLS material, or None when the job runs in plaintext."""
        if self.tls_dir is None:
            return None
        return JobTls.load(self.tls_dir, self.identity)

    def master(self) -> rpc.MasterStub:
        """The job's master, with the patience every job process has for it."""
        channel = open_channel(self.master_addr, self.token, MASTER, MASTER_PATIENCE, self.tls)
        return rpc.MasterStub(channel)

    def ps_listen_address(self, ps_id: int) -> tuple[str, str]:
        """(where PS `ps_id` listens, its fixed address or "" when it is the port bound)."""
        if self.ps_addrs:
            return self.listen_address(self.ps_addrs[ps_id]), self.ps_addrs[ps_id]
        return f"{self.bind_host or LOOPBACK}:0", ""

    def listen_address(self, address: str) -> str:
        """Where to listen to be reachable at `address`: its port, on the pod's IP when
        there is one (a Service's address is not an interface of the pod)."""
        host, port = address.rsplit(":", 1)
        return f"{self.bind_host or host}:{port}"

    @property
    def files(self) -> JobDir:
        """Where things live inside the job directory."""
        return JobDir(self.job_dir)

    def load_sources(self) -> dict[str, list[SourceInfo]]:
        """The resolved data sources: {'train': [...], 'validation': [...], 'prediction':
        [...]} (a job from before prediction data has no 'prediction')."""
        raw = json.loads(self.files.sources.read_text())
        return {k: [SourceInfo.from_dict(s) for s in v] for k, v in raw.items()}


def tls_dir_from_environ() -> Path | None:
    """Where the job's TLS files are, if the job has TLS."""
    where = os.environ.get(TLS_DIR_ENV)
    return Path(where) if where else None
