"""A server with a bound on the calls it holds (protocol/server_load.py), served for real:
the calls beyond it are turned away at once with the "busy" words, counted exactly by the
server, and a patient channel rides them out; a call too large for the wire is not
"busy" and is not retried."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import listen, make_server, open_channel
from elasticdl_nb.runtime.protocol.patience import Patience, PeerUnreachable, transient
from elasticdl_nb.runtime.protocol.server_load import BUSY_DETAILS, ServerLoad

HOLD_S = 0.5


class _Slow(rpc.MasterServicer):
    """GetStatus takes HOLD_S (a master behind its workers)."""

    def __init__(self):
        self.served = 0
        self.hold = HOLD_S

    def GetStatus(self, request, context):
        time.sleep(self.hold)
        self.served += 1
        return pb.JsonMessage(json="{}")

    def Stop(self, request, context):
        return pb.JsonMessage(json="{}")


@pytest.fixture
def slow_server():
    load = ServerLoad(max_calls=3, threads=2)
    servicer = _Slow()
    server = make_server("s3cret", "master", load=load)
    rpc.add_MasterServicer_to_server(servicer, server)
    port = listen(server, "127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", load, servicer
    server.stop(0)


def _at_once(stub, calls: int) -> list:
    """`calls` GetStatus calls sent together; each one's reply or error."""
    outcomes: list = [None] * calls
    go = threading.Barrier(calls)

    def call(i):
        go.wait()
        try:
            outcomes[i] = stub.GetStatus(pb.Empty(), timeout=30)
        except grpc.RpcError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=call, args=(i,)) for i in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_calls_beyond_the_bound_are_turned_away_at_once_and_counted(slow_server):
    address, load, servicer = slow_server
    stub = rpc.MasterStub(open_channel(address, "s3cret", "master"))  # (no patience)
    load.sample()
    began = time.monotonic()
    outcomes = _at_once(stub, 8)
    busy = [o for o in outcomes if isinstance(o, grpc.RpcError)]
    assert len(busy) == 5 and servicer.served == 3  # 3 held (2 running, 1 waiting)
    for err in busy:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details() == BUSY_DETAILS and transient(err)
    # Served in two rounds of the two threads: the third call waited one hold.
    assert time.monotonic() - began < 3 * HOLD_S
    stub.Stop(pb.StopRequest(), timeout=5)  # (the next arrival settles the last call)
    sample = load.sample()
    assert sample.arrived == 9 and sample.turned_away == 5 and sample.served == 4
    assert HOLD_S * 0.8 <= sample.longest_wait_s < 2 * HOLD_S
    assert sample.in_flight == 0 and sample.waiting == 0


def test_a_patient_channel_rides_out_a_busy_server(slow_server):
    address, load, servicer = slow_server
    patient = Patience(seconds=30, first_delay=0.05, max_delay=0.2)
    stub = rpc.MasterStub(open_channel(address, "s3cret", "master", patience=patient))
    outcomes = _at_once(stub, 8)
    assert all(isinstance(o, pb.JsonMessage) for o in outcomes), outcomes
    assert servicer.served == 8
    stub.Stop(pb.StopRequest(), timeout=5)
    assert load.sample().turned_away > 0  # (they were turned away, and came back)


def test_a_message_too_large_is_not_busy(slow_server):
    """RESOURCE_EXHAUSTED is also gRPC's code for a message over the limit: that one is
    not tried again (it would be refused again until the patience ran out)."""
    address, _, _ = slow_server
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 10)])
    with pytest.raises(grpc.RpcError) as refused:
        rpc.MasterStub(channel).Stop(pb.StopRequest(reason="x" * 100), timeout=5)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not transient(refused.value)


def test_the_patience_still_ends_against_a_server_that_stays_busy(slow_server):
    address, _, servicer = slow_server
    servicer.hold = 2.0  # (longer than the patience)
    patient = Patience(seconds=0.6, first_delay=0.05, max_delay=0.1)
    hog = rpc.MasterStub(open_channel(address, "s3cret", "master"))
    stub = rpc.MasterStub(open_channel(address, "s3cret", "master", patience=patient))
    hogs = [hog.GetStatus.future(pb.Empty(), timeout=30) for _ in range(3)]
    time.sleep(0.2)  # (they hold the server's three places)
    with pytest.raises(PeerUnreachable, match="RESOURCE_EXHAUSTED"):
        stub.Stop(pb.StopRequest(), timeout=5)
    for call in hogs:
        call.cancel()
