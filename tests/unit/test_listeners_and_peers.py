"""Every listener of a job binds its own port and answers only as itself; calls ride out
a peer that is briefly away and say so clearly when the peer is wrong or gone.

Real gRPC servers, bulk channels and ring listeners on loopback, in this process; no
TensorFlow.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent import futures

import grpc
import pytest

from elasticdl_nb.runtime.collective.ring import PeerLost, RingListener, connect, member_name
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.bulk import BulkClient
from elasticdl_nb.runtime.protocol.bulk_server import BulkServer
from elasticdl_nb.runtime.protocol.channels import AddressTaken, listen, make_server, open_channel
from elasticdl_nb.runtime.protocol.frames import READY, accept_hello, recv_frame
from elasticdl_nb.runtime.protocol.patience import Patience, PeerUnreachable, WrongPeer

HOST = "127.0.0.1"
QUICK = Patience(seconds=2.0, first_delay=0.05, max_delay=0.2)


class Master(rpc.MasterServicer):
    """Says which server it is; fails its first `unavailable` calls, and sleeps through
    the first `late` ones (seconds each)."""

    def __init__(self, me: int, unavailable: int = 0, late: float = 0.0):
        self.me, self.unavailable, self.late = me, unavailable, late
        self.calls = 0

    def GetStatus(self, request, context):
        self.calls += 1
        if self.calls <= self.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
        if self.late and self.calls == 1:
            time.sleep(self.late)
        return pb.JsonMessage(json=json.dumps({"me": self.me}))


class Ps(rpc.ParameterServerServicer):
    def __init__(self, me: int):
        self.me = me

    def GetBulkEndpoint(self, request, context):
        return pb.BulkEndpoint(port=self.me)  # (not a port here: who answered)


def master_server(token: str, servicer: Master) -> tuple[grpc.Server, str]:
    server = make_server(token, "master", threads=2)
    rpc.add_MasterServicer_to_server(servicer, server)
    address = f"{HOST}:{listen(server, f'{HOST}:0')}"
    server.start()
    return server, address


def status(address: str, token: str, patience: Patience | None = QUICK, timeout=5.0) -> dict:
    stub = rpc.MasterStub(open_channel(address, token, "master", patience))
    return json.loads(stub.GetStatus(pb.Empty(), timeout=timeout).json)


# ---------------------------------------------------------------------------- ports


def test_200_listeners_started_at_once_get_distinct_ports_and_each_answers_as_itself():
    kinds = ("master", "ps", "bulk", "ring")
    per_kind = 50

    def start(kind: str, i: int):
        token = f"job-{i}"
        if kind == "master":
            server, address = master_server(token, Master(i))
            return server, address
        if kind == "ps":
            server = make_server(token, f"ps-{i}", threads=2)
            rpc.add_ParameterServerServicer_to_server(Ps(i), server)
            address = f"{HOST}:{listen(server, f'{HOST}:0')}"
            server.start()
            return server, address
        if kind == "bulk":
            handler = lambda request, buffers, i=i: (pb.PushPullResponse(version=i), [])  # noqa: E731
            server = BulkServer(HOST, token, f"ps-{i}", handler, timeout=10).start()
            return server, f"{HOST}:{server.port}"
        listener = RingListener(HOST, token, i)
        return listener, listener.address

    jobs = [(kind, i) for kind in kinds for i in range(per_kind)]
    with futures.ThreadPoolExecutor(32) as pool:  # the binds race each other
        started = dict(zip(jobs, pool.map(lambda job: start(*job), jobs)))
    try:
        ports = [address.rsplit(":", 1)[1] for _, address in started.values()]
        assert len(set(ports)) == len(ports) == 200

        for (kind, i), (server, address) in started.items():
            token = f"job-{i}"
            if kind == "master":
                assert status(address, token) == {"me": i}
            elif kind == "ps":
                stub = rpc.ParameterServerStub(open_channel(address, token, f"ps-{i}"))
                assert stub.GetBulkEndpoint(pb.Empty(), timeout=5).port == i
            elif kind == "bulk":
                client = BulkClient(HOST, token, f"ps-{i}", lambda s=server: s.port, timeout=5)
                assert client.push_pull(pb.PushPullRequest())[0].version == i
                client.close()
            else:
                connect(address, token, 1, 999, i, timeout=5).close()
                server.take(1, 999, timeout=5).close()  # it arrived here, for this member
    finally:
        for (kind, _), (server, _) in started.items():
            close(kind, server)


def close(kind: str, server) -> None:
    """Stop a listener of any kind: a gRPC server ("master", "ps", "grpc"), a bulk
    server, a ring listener."""
    if kind == "bulk":
        server.stop()
    elif kind == "ring":
        server.close()
    else:
        server.stop(None)


@pytest.mark.parametrize("first", ["grpc", "bulk", "ring"])
@pytest.mark.parametrize("second", ["grpc", "bulk", "ring"])
def test_a_second_listener_on_a_port_one_of_ours_holds_fails_with_a_clear_error(first, second):
    def open_on(kind: str, port: int):
        if kind == "grpc":
            server = make_server("t", "ps-0")
            bound = listen(server, f"{HOST}:{port}")
            server.start()
            return server, bound
        if kind == "bulk":
            server = BulkServer(HOST, "t", "ps-0", lambda r, b: (pb.PushPullResponse(), []), port)
            return server.start(), server.port
        listener = RingListener(HOST, "t", 0, port)
        return listener, int(listener.address.rsplit(":", 1)[1])

    holder, port = open_on(first, 0)
    try:
        with pytest.raises(AddressTaken, match=f"cannot listen on {HOST}:{port}.*Another process"):
            taker, _ = open_on(second, port)
            close(second, taker)  # (only if the bind wrongly succeeded)
    finally:
        close(first, holder)


# ---------------------------------------------------------------------------- peers


def test_a_call_meant_for_another_server_of_the_job_is_refused_naming_both():
    server = make_server("t", "ps-1", threads=2)
    rpc.add_ParameterServerServicer_to_server(Ps(1), server)
    address = f"{HOST}:{listen(server, f'{HOST}:0')}"
    server.start()
    try:
        plain = rpc.ParameterServerStub(open_channel(address, "t", "ps-0"))
        with pytest.raises(grpc.RpcError) as refused:
            plain.GetBulkEndpoint(pb.Empty(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == "this is ps-1 of the job, not ps-0"
        patient = rpc.ParameterServerStub(open_channel(address, "t", "ps-0", QUICK))
        with pytest.raises(WrongPeer, match=f"the ps-0 at {address} is another server of this"):
            patient.GetBulkEndpoint(pb.Empty(), timeout=5)
    finally:
        server.stop(None)


def test_another_jobs_server_or_a_foreign_one_is_a_wrong_peer_at_once():
    server, address = master_server("other-job", Master(0))
    foreign = grpc.server(futures.ThreadPoolExecutor(1))  # not ours: no such service
    foreign_address = f"{HOST}:{foreign.add_insecure_port(f'{HOST}:0')}"
    foreign.start()
    try:
        start = time.monotonic()
        with pytest.raises(WrongPeer, match="refused this job's token: it is not a server"):
            status(address, "this-job")
        with pytest.raises(WrongPeer, match="does not serve this call"):
            status(foreign_address, "this-job")
        assert time.monotonic() - start < 1.0  # not retried: it will not get better
    finally:
        server.stop(None)
        foreign.stop(None)


def test_a_peer_that_is_briefly_unavailable_or_late_is_waited_for():
    flaky, late = Master(1, unavailable=2), Master(2, late=1.5)
    servers = [master_server("t", flaky), master_server("t", late)]
    try:
        assert status(servers[0][1], "t") == {"me": 1}
        assert flaky.calls == 3
        assert status(servers[1][1], "t", timeout=0.5) == {"me": 2}  # its first reply missed
        assert late.calls >= 2
    finally:
        for server, _ in servers:
            server.stop(None)


def test_a_peer_that_never_answers_is_given_up_on_with_its_address_and_the_time_tried():
    with socket.socket() as held:  # bound, never listening: every connection is refused
        held.bind((HOST, 0))
        address = f"{HOST}:{held.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(PeerUnreachable) as gone:
            status(address, "t")
        waited = time.monotonic() - start
    assert 1.0 < waited < 4.0
    assert f"the master at {address} did not answer GetStatus for" in str(gone.value)
    assert "(limit 2 s): UNAVAILABLE" in str(gone.value)


def test_a_ring_link_to_a_member_not_yet_listening_is_retried_until_it_listens():
    # Members of a new group start at once (a restarted incarnation): a successor's port
    # refuses connections until its listener is up, and the link must wait for it.
    with socket.socket() as late:  # bound, listening only later: refused until then
        late.bind((HOST, 0))
        address = f"{HOST}:{late.getsockname()[1]}"
        with futures.ThreadPoolExecutor(1) as pool:
            link = pool.submit(connect, address, "t", 3, 1, 2, 10.0)
            time.sleep(0.5)
            assert not link.done()  # refused so far, and still trying
            late.listen()
            late.settimeout(10)  # a link that gave up instead fails here, not hangs
            conn, _ = late.accept()
            with conn:
                assert accept_hello(conn, "t", member_name(2))  # meant for member 2
                conn.sendall(READY)
                _, intro, _ = recv_frame(conn, 5, 5)
                assert json.loads(intro) == {"version": 3, "worker": 1, "purpose": "ring"}
                link.result(timeout=5).close()


def test_a_ring_link_to_a_member_that_never_listens_is_given_up_after_its_timeout():
    with socket.socket() as held:
        held.bind((HOST, 0))
        start = time.monotonic()
        with pytest.raises(PeerLost, match="not listening within 1 s"):
            connect(f"{HOST}:{held.getsockname()[1]}", "t", 1, 0, 1, timeout=1.0)
    assert 1.0 <= time.monotonic() - start < 3.0


def test_a_channel_without_patience_fails_on_the_first_refusal():
    with socket.socket() as held:
        held.bind((HOST, 0))
        with pytest.raises(grpc.RpcError) as refused:
            status(f"{HOST}:{held.getsockname()[1]}", "t", patience=None)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
