"""The Master gRPC service: messages in, `JobMaster` calls, messages out.

A call that cannot be answered as asked is refused with a code that is never transient
(FAILED_PRECONDITION, ABORTED): UNAVAILABLE and DEADLINE_EXCEEDED mean the transport,
and callers retry those (protocol/patience.py).
"""

from __future__ import annotations

import json

import grpc

from elasticdl_nb.runtime.collective.ring import PeerLost
from elasticdl_nb.runtime.master.job_master import JobMaster
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc


class MasterService(rpc.MasterServicer):
    def __init__(self, master: JobMaster):
        self.master = master

    def GetTask(self, request, context):
        return self.master.get_task(request.worker_id, request.seq)

    def ReportProgress(self, request, context):
        return self.master.report(request)

    def ReportPsReady(self, request, context):
        self.master.ps_ready(
            request.ps_id, request.restored_version, request.address, request.incarnation
        )
        return pb.Empty()

    def GetPsAddresses(self, request, context):
        with self.master.lock:
            return pb.PsAddresses(addresses=self.master.ps_addresses)

    def StreamEvents(self, request, context):
        for event in self.master.journal.read(
            request.from_seq, request.follow, is_cancelled=lambda: not context.is_active()
        ):
            yield pb.Event(
                seq=event.seq, time=event.time, kind=event.kind, data=json.dumps(event.data)
            )

    def GetStatus(self, request, context):
        return pb.JsonMessage(json=json.dumps(self.master.status()))

    def Scale(self, request, context):
        try:
            return pb.JsonMessage(json=json.dumps(self.master.scale(request.workers)))
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def Stop(self, request, context):
        self.master.stop(request.reason)
        return pb.JsonMessage(json=json.dumps({"state": self.master.state}))

    # ------------------------------------------------------------------ allreduce group

    def _group(self, context):
        if self.master.group is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not an allreduce job")
        return self.master.group

    def JoinGroup(self, request, context):
        group = self._group(context)
        if not self.master.instances.takes_work(request.worker_id):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this worker is not wanted")
        try:
            return group.join(request.worker_id, request.address)
        except PeerLost as exc:
            context.abort(grpc.StatusCode.ABORTED, str(exc))

    def GetGroup(self, request, context):
        return self._group(context).get(request.version)

    def ReportLost(self, request, context):
        try:
            return self._group(context).report_lost(request)
        except PeerLost as exc:
            context.abort(grpc.StatusCode.ABORTED, str(exc))
