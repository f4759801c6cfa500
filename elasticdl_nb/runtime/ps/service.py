"""The ParameterServer service: a thin translation between messages and the store.

PushPull arrives on the bulk channel (protocol/bulk.py, `push_pull`), its large tensors out
of band; the gRPC methods are the control calls (Init, GetApplied, Checkpoint, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.bulk import BulkError
from elasticdl_nb.runtime.protocol.tensors import to_array, to_tensor
from elasticdl_nb.runtime.ps.push import Push
from elasticdl_nb.runtime.ps.store import ParameterStore, TableError, VariableSpec
from elasticdl_nb.runtime.table_def import TableDef


class ParameterServerService(rpc.ParameterServerServicer):
    def __init__(self, store: ParameterStore, on_update, checkpoint_now):
        self.store = store
        self._on_update = on_update  # called after each applied push
        self._checkpoint_now = checkpoint_now  # () -> (version, path)
        # Versions of a restored PS repeat numbers the workers saw before the crash; the
        # incarnation tells them apart.
        self.incarnation = time.time_ns()
        self.bulk_port = 0  # set by the process once its bulk channel listens

    def Init(self, request: pb.InitRequest, context) -> pb.InitResponse:
        dense = [VariableSpec(v.name, to_array(v.value).copy()) for v in request.variables]
        tables = [TableDef.from_json(text) for text in request.tables]
        seeds = {v.name: to_array(v.value) for v in request.table_seeds}
        try:
            accepted = self.store.init(dense, tables, seeds)
        except TableError as err:  # (preflight refuses such a job before launch)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        if accepted:
            self._on_update(force=True)  # checkpoint version 0: a restart never starts empty
        return pb.InitResponse(accepted=accepted, version=self.store.version)

    def push_pull(
        self, request: pb.PushPullRequest, buffers: Sequence[np.ndarray] = ()
    ) -> tuple[pb.PushPullResponse, list[np.ndarray]]:
        """(reply, the reply's out-of-band arrays) for a request and its out-of-band
        `buffers`. Refuses a bad request with a BulkError (a grpc.RpcError) carrying the
        status code."""
        store = self.store
        reply = pb.PushPullResponse(incarnation=self.incarnation)
        out: list[np.ndarray] = []
        if not store.initialized:
            reply.initialized = False
            return reply, []
        reply.initialized = True
        push = None
        if request.batch_key >= 0:
            ledger = request.ledger_range
            push = Push(
                request.epoch,
                request.source,
                request.batch_key,
                {name: to_array(t, buffers) for name, t in request.dense_grads.items()},
                {
                    name: (to_array(r.ids, buffers), to_array(r.values, buffers))
                    for name, r in request.table_grads.items()
                },
                (ledger.start, ledger.end) if request.HasField("ledger_range") else None,
                request.gradient_version,
                request.learning_rate,
            )
        wanted = {name: to_array(ids, buffers) for name, ids in request.pull_ids.items()}
        unknown = set(wanted) - set(store.tables)
        if unknown:
            raise BulkError(grpc.StatusCode.INVALID_ARGUMENT, f"no tables {sorted(unknown)} here")
        known = -1 if request.pull_all else request.known_version
        done = store.exchange(push, known, wanted)
        reply.version, reply.stale = done.version, done.stale
        reply.learning_rate = done.learning_rate
        reply.duplicate = push is not None and not done.accepted and not done.stale
        if done.updated:
            self._on_update()
        for name, value in done.dense.items():
            to_tensor(value, reply.dense[name], out)
        for name, value in done.rows.items():
            to_tensor(value, reply.rows[name], out)
        if request.pull_all:
            for name in store.tables:
                try:
                    to_tensor(store.read_table(name), reply.rows[name], out)
                except TableError as err:
                    raise BulkError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from err
        return reply, out

    def GetApplied(self, request: pb.AppliedRequest, context) -> pb.AppliedBatches:
        if request.flush and self.store.flush():
            self._on_update()
        with self.store.lock:
            reply = pb.AppliedBatches(version=self.store.version)
            for (epoch, source), keys in self.store.applied.items():
                reply.entries.add(epoch=epoch, source=source, batch_keys=sorted(keys))
        return reply

    def Checkpoint(self, request: pb.Empty, context) -> pb.CheckpointResponse:
        version, path = self._checkpoint_now()
        return pb.CheckpointResponse(version=version, path=str(path))

    def GetBulkEndpoint(self, request: pb.Empty, context) -> pb.BulkEndpoint:
        return pb.BulkEndpoint(port=self.bulk_port)

    def ExportTables(self, request: pb.ExportTablesRequest, context) -> pb.JsonMessage:
        written = self.store.export_tables(Path(request.directory))
        return pb.JsonMessage(json=json.dumps(written))

    def GetTableStats(self, request: pb.Empty, context) -> pb.JsonMessage:
        return pb.JsonMessage(json=json.dumps(self.store.table_stats()))
