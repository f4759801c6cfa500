"""Every kind of endpoint a job opens, with the job's TLS on (protocol/tls.py): the master's
and a PS's gRPC servers (on TCP and on the local master's abstract Unix socket), the PS's
bulk channel and the allreduce ring. Each serves a client holding the job's certificates
and token; a client with the right token but plaintext, or with another job's
certificates, is refused; and the token is still checked on top of TLS."""

from __future__ import annotations

import os
import threading

import grpc
import numpy as np
import pytest

from elasticdl_nb.runtime.collective import Group, PeerLost, Ring, RingListener
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol import tls
from elasticdl_nb.runtime.protocol.bulk import BulkClient, BulkError
from elasticdl_nb.runtime.protocol.bulk_server import BulkServer
from elasticdl_nb.runtime.protocol.channels import listen, make_server, open_channel

TOKEN = "job-token"
CLIENTS = ["the job's", "plaintext", "another job's"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The TLS files a job with one PS gets, written as a local job's are."""
    directory = tmp_path_factory.mktemp("job") / "tls"
    tls.write(directory, tls.issue(tls.job_names(1), "job-a"))
    return directory


@pytest.fixture(scope="module")
def other_job(tmp_path_factory):
    directory = tmp_path_factory.mktemp("other") / "tls"
    tls.write(directory, tls.issue(tls.job_names(1), "job-b"))
    return directory


def client_tls(client: str, job, other_job, name: str) -> tls.JobTls | None:
    return {
        "the job's": lambda: tls.JobTls.load(job, name),
        "plaintext": lambda: None,
        "another job's": lambda: tls.JobTls.load(other_job, name),
    }[client]()


def test_the_files_are_the_owners_only(job):
    assert os.stat(job).st_mode & 0o777 == 0o700
    modes = {path.name: path.stat().st_mode & 0o777 for path in job.iterdir()}
    assert set(modes) == {f for n in tls.job_names(1) for f in tls.files_of(n)}
    assert set(modes.values()) == {0o600}


class Master(rpc.MasterServicer):
    def GetPsAddresses(self, request, context):
        return pb.PsAddresses(addresses=["ps-0 is here"])


@pytest.fixture(scope="module", params=["tcp", "unix-abstract"])
def master(request, job):
    server = make_server(TOKEN, tls.MASTER, threads=2)
    rpc.add_MasterServicer_to_server(Master(), server)
    if request.param == "tcp":
        address = f"127.0.0.1:{listen(server, '127.0.0.1:0', tls.JobTls.load(job, tls.MASTER))}"
    else:
        address = f"unix-abstract:elasticdl-nb-tls-test-{os.getpid()}"
        listen(server, address, tls.JobTls.load(job, tls.MASTER))
    server.start()
    yield address
    server.stop(None)


@pytest.mark.parametrize("client", CLIENTS)
def test_grpc_serves_the_jobs_certificates_only(job, other_job, master, client):
    secure = client_tls(client, job, other_job, tls.WORKER)
    stub = rpc.MasterStub(open_channel(master, TOKEN, tls.MASTER, tls=secure))
    if client == "the job's":
        assert stub.GetPsAddresses(pb.Empty(), timeout=10).addresses == ["ps-0 is here"]
        return
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetPsAddresses(pb.Empty(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed


def test_grpc_over_tls_still_wants_the_token(job, master):
    secure = tls.JobTls.load(job, tls.WORKER)
    stub = rpc.MasterStub(open_channel(master, "another-token", tls.MASTER, tls=secure))
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetPsAddresses(pb.Empty(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture(scope="module")
def bulk(job):
    def echo(request, buffers):
        return pb.PushPullResponse(version=request.batch_key), [b.copy() for b in buffers]

    server = BulkServer(
        "127.0.0.1", TOKEN, "ps-0", echo, timeout=10, tls=tls.JobTls.load(job, "ps-0")
    ).start()
    yield server
    server.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_the_bulk_channel_serves_the_jobs_certificates_only(job, other_job, bulk, client):
    secure = client_tls(client, job, other_job, tls.WORKER)
    channel = BulkClient("127.0.0.1", TOKEN, "ps-0", lambda: bulk.port, timeout=10, tls=secure)
    tensor = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: many TLS records each way
    try:
        if client == "the job's":
            reply, buffers = channel.push_pull(pb.PushPullRequest(batch_key=5), [tensor])
            assert reply.version == 5
            np.testing.assert_array_equal(buffers[0].view(np.float32), tensor)
            return
        with pytest.raises(BulkError) as refused:
            channel.push_pull(pb.PushPullRequest(batch_key=5), [tensor])
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()


def test_the_bulk_channel_over_tls_still_wants_the_token(job, bulk):
    secure = tls.JobTls.load(job, tls.WORKER)
    channel = BulkClient("127.0.0.1", "another-token", "ps-0", lambda: bulk.port, tls=secure)
    with pytest.raises(BulkError) as refused:
        channel.push_pull(pb.PushPullRequest(batch_key=5))
    assert "did not accept us" in refused.value.details()
    channel.close()


def test_a_bulk_client_meaning_another_name_is_refused(job, bulk):
    """The PS's certificate says ps-0: a client that means ps-1 (an address that changed
    hands) stops at the handshake."""
    secure = tls.JobTls.load(job, tls.WORKER)
    channel = BulkClient("127.0.0.1", TOKEN, "ps-1", lambda: bulk.port, tls=secure)
    with pytest.raises(BulkError) as refused:
        channel.push_pull(pb.PushPullRequest(batch_key=5))
    assert "CERTIFICATE_VERIFY_FAILED" in refused.value.details()
    channel.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_the_ring_joins_the_jobs_certificates_only(job, other_job, client):
    """Member 0 listens with the job's worker certificate; member 1 connects with the
    client's. The job's: the two sum alike; the others: member 1 cannot connect."""
    credentials = [tls.JobTls.load(job, tls.WORKER), client_tls(client, job, other_job, tls.WORKER)]
    listeners = [RingListener("127.0.0.1", TOKEN, w, tls=credentials[w]) for w in range(2)]
    group = Group(1, tuple((w, listeners[w].address) for w in range(2)))
    sums: dict[int, object] = {}

    def member(worker: int) -> None:
        try:
            ring = Ring(group, worker, listeners[worker], TOKEN, 5, tls=credentials[worker])
            arrays = [np.full(1000, worker + 1, np.float32)]
            sums[worker] = ring.allreduce(arrays, step=0, timeout=5)[0]
            ring.close()
        except PeerLost as lost:
            sums[worker] = lost

    threads = [threading.Thread(target=member, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for listener in listeners:
        listener.close()
    if client == "the job's":
        for worker in range(2):
            np.testing.assert_array_equal(sums[worker], np.full(1000, 3, np.float32))
    else:
        assert all(isinstance(sums[w], PeerLost) for w in range(2)), sums
