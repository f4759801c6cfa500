"""Where a local job's master stands: on loopback, with its workers and PS as child
processes (see processes.py) and each PS at a port chosen now, so every worker starts
knowing every PS address."""

from __future__ import annotations

import socket
from pathlib import Path

from elasticdl_nb.backends.instance_event import EventSink
from elasticdl_nb.backends.local.processes import LocalProcesses

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class LocalSite:
    def __init__(self, job_dir: Path, ps: int):
        self.job_dir = job_dir
        self.ps_addrs = [f"{HOST}:{_free_port()}" for _ in range(ps)]

    def bind(self, server) -> str:
        """Listen on a free loopback port; returns the address to advertise."""
        return f"{HOST}:{server.add_insecure_port(f'{HOST}:0')}"

    def launcher(self, env: dict[str, str], on_event: EventSink) -> LocalProcesses:
        return LocalProcesses(self.job_dir, env, on_event)
