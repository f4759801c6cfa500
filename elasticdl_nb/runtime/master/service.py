"""The Master gRPC service: messages in, `JobMaster` calls, messages out.

The calls every job has go to the `JobMaster`; the PS's calls (ReportPsReady,
GetPsAddresses) and the allreduce group's (JoinGroup, GetGroup, ReportLost) go to the
job's strategy, and are refused in a job of the other strategy.

A call that cannot be answered as asked is refused with a code that is never transient
(FAILED_PRECONDITION, ABORTED): UNAVAILABLE and DEADLINE_EXCEEDED mean the transport,
and callers retry those (protocol/patience.py).
"""

from __future__ import annotations

import json

import grpc

from elasticdl_nb.runtime.collective.ring import PeerLost
from elasticdl_nb.runtime.master.allreduce_group import AllreduceGroup
from elasticdl_nb.runtime.master.job_master import JobMaster
from elasticdl_nb.runtime.master.ps_strategy import PsStrategy
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc


class MasterService(rpc.MasterServicer):
    def __init__(self, master: JobMaster):
        self.master = master

    def GetTask(self, request, context):
        return self.master.get_task(request.worker_id, request.seq)

    def ReportProgress(self, request, context):
        return self.master.report(request)

    def Scale(self, request, context):
        try:
            scaled = self.master.scale(request.workers, request.min_workers)
            return pb.JsonMessage(json=json.dumps(scaled))
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def Stop(self, request, context):
        self.master.stop(request.reason)
        return pb.JsonMessage(json=json.dumps({"state": self.master.state}))

    def StreamEvents(self, request, context):
        for event in self.master.journal.read(
            request.from_seq, request.follow, is_cancelled=lambda: not context.is_active()
        ):
            yield pb.Event(
                seq=event.seq, time=event.time, kind=event.kind, data=json.dumps(event.data)
            )

    def GetStatus(self, request, context):
        return pb.JsonMessage(json=json.dumps(self.master.status()))

    # ------------------------------------------------------------------ parameter servers

    def _ps(self, context) -> PsStrategy:
        return self._strategy(PsStrategy, "a parameter-server job", context)

    def ReportPsReady(self, request, context):
        self._ps(context).ps_ready(
            request.ps_id, request.restored_version, request.address, request.incarnation
        )
        return pb.Empty()

    def GetPsAddresses(self, request, context):
        return pb.PsAddresses(addresses=self._ps(context).addresses_now())

    # ------------------------------------------------------------------ allreduce group

    def _group(self, context) -> AllreduceGroup:
        return self._strategy(AllreduceGroup, "an allreduce job", context)

    def _strategy(self, kind: type, job: str, context):
        """The job's strategy if it is of `kind`; else the call is refused."""
        strategy = self.master.strategy
        if not isinstance(strategy, kind):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"not {job}")
        return strategy

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
