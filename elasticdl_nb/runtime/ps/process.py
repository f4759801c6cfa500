"""A parameter-server process: `python -m elasticdl_nb.runtime.ps --id N`.

It restores the newest checkpoint of its shard if there is one, serves the
ParameterServer service's control calls over gRPC on a port the OS gives it (on
Kubernetes: the fixed port behind its Service) and the training steps' PushPull on a
bulk channel beside it (workers ask for its port with GetBulkEndpoint), tells the master
where it serves, that it is ready and what it restored (workers learn its address from
the master), and checkpoints every `checkpoint_steps` applied updates in a background
thread.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from elasticdl_nb.model import load_bundle
from elasticdl_nb.runtime.exit_codes import WRONG_PEER_EXIT
from elasticdl_nb.runtime.logs import setup_logging
from elasticdl_nb.runtime.process_env import ProcessEnv
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.bulk_server import BulkServer
from elasticdl_nb.runtime.protocol.channels import host_of, listen, make_server
from elasticdl_nb.runtime.protocol.patience import WrongPeer
from elasticdl_nb.runtime.protocol.tls import ps_name
from elasticdl_nb.runtime.ps.checkpoints import CheckpointDir
from elasticdl_nb.runtime.ps.service import ParameterServerService
from elasticdl_nb.runtime.ps.store import ParameterStore

log = logging.getLogger("elasticdl_nb.ps")


DELTAS_PER_BASE = 9  # a shard with tables writes them whole every tenth checkpoint


class Checkpointer:
    """Saves the store every `every` versions, off the request path: its tables whole
    the first time (in this process) and every `DELTAS_PER_BASE + 1`-th time, else what
    changed in them since the checkpoint before."""

    def __init__(self, store: ParameterStore, directory: CheckpointDir, every: int):
        self.store, self.directory, self.every = store, directory, every
        self.saved_version = -1
        self._deltas: int | None = None  # deltas written since this process's last base
        self._forced = False
        self._wake = threading.Event()
        self._save_lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True, name="checkpointer").start()

    def note_update(self, force: bool = False) -> None:
        if force:
            self._forced = True
        if force or self._due():
            self._wake.set()

    def _due(self) -> bool:
        return self.store.version - self.saved_version >= self.every

    def save_now(self):
        with self._save_lock:
            delta = self.store.tables and self._deltas is not None
            delta = delta and self._deltas < DELTAS_PER_BASE
            state = self.store.snapshot(self.saved_version if delta else None)
            if state["version"] == self.saved_version:
                return self.saved_version, self.directory.paths()[-1]
            started = time.perf_counter()
            path = self.directory.save(state)
            self.store.saved(state["version"])
            self._deltas = self._deltas + 1 if delta else 0
            self.saved_version = state["version"]
            rows = sum(len(t.ids) for t in state["tables"])
            log.info(
                "checkpoint version %d -> %s (%d table rows, %.2f s)",
                state["version"],
                path.name,
                rows,
                time.perf_counter() - started,
            )
            return state["version"], path

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            # Updates applied while the previous save was writing woke us again; save only
            # if a whole interval has passed since that save.
            forced, self._forced = self._forced, False
            if self.store.initialized and (forced or self._due()):
                self.save_now()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--id", type=int, required=True)
    ps_id = parser.parse_args().id
    setup_logging(f"ps-{ps_id}")
    identity = ps_name(ps_id)
    env = ProcessEnv.from_environ(identity)
    spec = env.files.read_spec()
    contract = load_bundle(env.files.bundle)

    store = ParameterStore(
        contract.optimizer,
        ps_id,
        spec.ps,
        spec.record_ledger,
        spec.minibatch_size,
        spec.grads_to_wait,
        contract.version_schedule(),
    )
    directory = CheckpointDir(env.files.checkpoints, ps_id, spec.keep_checkpoints)
    restored_version = -1
    newest = directory.load_newest()
    if newest is not None:
        state, path = newest
        store.restore(state)
        restored_version = store.version
        log.info("restored %s (version %d)", path.name, restored_version)
    checkpointer = Checkpointer(store, directory, spec.checkpoint_steps)
    checkpointer.saved_version = restored_version

    service = ParameterServerService(store, checkpointer.note_update, checkpointer.save_now)
    server = make_server(env.token, identity)
    rpc.add_ParameterServerServicer_to_server(service, server)
    listen_at, fixed = env.ps_listen_address(ps_id)
    port = listen(server, listen_at, env.tls)
    address = fixed or f"{listen_at.rsplit(':', 1)[0]}:{port}"
    bulk = BulkServer(
        host_of(listen_at), env.token, identity, service.push_pull, env.bulk_port, tls=env.tls
    ).start()
    service.bulk_port = bulk.port
    server.start()
    log.info("PS %d serving on %s (bulk channel on port %d)", ps_id, address, bulk.port)

    ready = pb.PsReady(
        ps_id=ps_id,
        restored_version=restored_version,
        address=address,
        incarnation=service.incarnation,
    )
    try:
        env.master().ReportPsReady(ready, timeout=10)
    except WrongPeer as exc:
        log.error("%s", exc)
        raise SystemExit(WRONG_PEER_EXIT) from None

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    log.info("PS %d stopping at version %d", ps_id, store.version)
    bulk.stop()
    server.stop(grace=1).wait()
