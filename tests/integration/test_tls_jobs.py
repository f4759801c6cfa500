"""Local jobs with `tls=True`: every connection of the job is mutual TLS under the job's
own certificates, and training is what it is in plaintext (every record applied once).

While the job runs, its real endpoints are probed from outside with the job's token:
over plaintext, the master, each PS's gRPC server and its bulk channel all refuse; with
the notebook's certificate they answer. The allreduce variant runs the ring over TLS."""

from __future__ import annotations

import time

import grpc
import pytest

from elasticdl_nb.backends import job_records
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.bulk import BulkClient, BulkError
from elasticdl_nb.runtime.protocol.channels import host_of, open_channel
from elasticdl_nb.runtime.protocol.tls import MASTER, ps_name
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.conftest import job_processes
from tests.integration.models import digits_job

pytestmark = pytest.mark.slow


def _running_ps(master: rpc.MasterStub, count: int, timeout: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        addresses = list(master.GetPsAddresses(pb.Empty(), timeout=10).addresses)
        if len(addresses) == count and all(addresses):
            return addresses
        time.sleep(0.2)
    raise AssertionError(f"the PS were not all up within {timeout} s")


def _refused(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


def test_a_ps_job_with_tls_serves_nothing_in_plaintext_and_trains_exactly_once(job_home):
    job, (x, _), _ = digits_job(workers=2, ps=2, epochs=6, tls=True)
    record = job_records.find_job(job.name)
    assert record.tls is not None, "the notebook holds the job's certificate"
    deadline = time.monotonic() + 60
    while not record.master and time.monotonic() < deadline:
        time.sleep(0.1)
    address, token = record.master["address"], record.token

    secure = rpc.MasterStub(open_channel(address, token, MASTER, tls=record.tls))
    plain = rpc.MasterStub(open_channel(address, token, MASTER))
    assert _refused(lambda: plain.GetStatus(pb.Empty(), timeout=10)) == grpc.StatusCode.UNAVAILABLE
    for ps, ps_address in enumerate(_running_ps(secure, 2)):
        name = ps_name(ps)
        ps_secure = rpc.ParameterServerStub(open_channel(ps_address, token, name, tls=record.tls))
        bulk_port = ps_secure.GetBulkEndpoint(pb.Empty(), timeout=10).port
        ps_plain = rpc.ParameterServerStub(open_channel(ps_address, token, name))
        no_tls = _refused(lambda s=ps_plain: s.GetBulkEndpoint(pb.Empty(), timeout=10))
        assert no_tls == grpc.StatusCode.UNAVAILABLE
        bulk_plain = BulkClient(host_of(ps_address), token, name, lambda p=bulk_port: p)
        with pytest.raises(BulkError, match="did not accept us"):
            bulk_plain.push_pull(pb.PushPullRequest())
        bulk_plain.close()

    status = job.wait(timeout=300)
    assert status["state"] == "succeeded"
    assert status["metrics"]["accuracy"] >= 0.90
    assert ledger_problems(job.dir, 2, [len(x)], epochs=6) == []
    assert job_processes(job_home) == []


def test_an_allreduce_job_with_tls_trains_over_an_encrypted_ring(job_home):
    job, _, _ = digits_job(workers=2, strategy="allreduce", epochs=4, tls=True)
    status = job.wait(timeout=300)
    assert status["state"] == "succeeded"
    assert status["metrics"]["accuracy"] >= 0.90
    assert job_processes(job_home) == []
