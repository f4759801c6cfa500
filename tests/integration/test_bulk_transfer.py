"""The bulk channel with a real PS process: the same values as gRPC, and a PS restart."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.worker.ps_client import PsClient, PushPayload
from tests.integration.job_process import LEARNING_RATE, TOKEN, JobProcess, StubMaster

pytestmark = pytest.mark.slow


@pytest.fixture
def ps(tmp_path):
    master = StubMaster()
    ps = JobProcess(tmp_path / "job", master)
    ps.start()
    yield ps
    ps.stop()
    master.server.stop(0)


VALUE = np.random.default_rng(0).standard_normal((512, 1024), dtype=np.float32)  # 2 MiB


def client_for(ps: JobProcess, bulk: bool) -> PsClient:
    client = PsClient(lambda: [ps.master.ps_address], TOKEN, give_up_after=120)
    if not bulk:
        client.bulk_threshold = 1 << 62
    client.set_model([("w", VALUE), ("b", np.zeros(3, np.float32))], [])
    return client


def pull(client: PsClient) -> dict[str, np.ndarray]:
    client.versions[0] = -1
    dense, _ = client.exchange(None, {})
    return dense


def push(client: PsClient, key: int, grads: dict[str, np.ndarray]) -> None:
    client.exchange(PushPayload(0, 0, key, key + 1, grads, {}, False), {})


def bulk_connections(client: PsClient) -> int:
    return len(client.bulk[0]._open)


def test_bulk_and_grpc_pushes_and_pulls_give_the_same_values(ps):
    fast, slow = client_for(ps, bulk=True), client_for(ps, bulk=False)
    fast.initialize()
    for dense in (pull(fast), pull(slow)):
        np.testing.assert_array_equal(dense["w"], VALUE)
    assert bulk_connections(fast) == 1 and bulk_connections(slow) == 0

    rng = np.random.default_rng(1)
    expected = VALUE.copy()
    for key, client in enumerate([fast, slow, fast]):
        grad = rng.standard_normal(VALUE.shape, dtype=np.float32)
        push(client, key, {"w": grad, "b": np.ones(3, np.float32)})
        expected -= np.float32(LEARNING_RATE) * grad
        over_bulk, over_grpc = pull(fast), pull(slow)
        for name in ("w", "b"):
            assert over_bulk[name].dtype == over_grpc[name].dtype == np.float32
            np.testing.assert_array_equal(over_bulk[name], over_grpc[name])
        np.testing.assert_allclose(over_bulk["w"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(over_bulk["b"], np.full(3, -LEARNING_RATE * (key + 1)))
    assert fast.versions[0] == slow.versions[0] == 3
    assert bulk_connections(fast) == 1  # one persistent connection for every exchange


def test_a_relaunched_ps_is_reached_again_over_the_bulk_channel(ps):
    client = client_for(ps, bulk=True)
    client.initialize()
    push(client, 0, {"w": np.ones_like(VALUE)})
    stub = client.stubs[0]
    saved = stub.Checkpoint(pb.Empty(), timeout=60)
    assert saved.version == 1
    old_port = stub.GetBulkEndpoint(pb.Empty(), timeout=10).port
    push(client, 1, {"w": np.ones_like(VALUE)})  # version 2: lost with the PS
    assert client.versions[0] == 2

    ps.stop(signal.SIGKILL)
    result = {}
    # The exchange fails over bulk and retries until the PS is back. (It runs on another
    # thread: the PS must be started by this one, which its parent-death signal watches.)
    exchange = threading.Thread(target=lambda: result.update(dense=client.exchange(None, {})[0]))
    exchange.start()
    time.sleep(1.0)
    ps.start()
    exchange.join(120)
    dense = result["dense"]
    assert client.stubs[0].GetBulkEndpoint(pb.Empty(), timeout=10).port != old_port
    once = VALUE - np.float32(LEARNING_RATE)
    np.testing.assert_array_equal(dense["w"], once)
    assert client.versions[0] == 1
    push(client, 1, {"w": np.ones_like(VALUE)})  # redone after the crash: applied again
    np.testing.assert_array_equal(pull(client)["w"], once - np.float32(LEARNING_RATE))
