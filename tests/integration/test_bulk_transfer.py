"""The bulk channel with a real PS process: exact values for large (out of band) and small
(in the message) tensors from two clients, and a PS restart."""

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


def client_for(ps: JobProcess) -> PsClient:
    client = PsClient(lambda: [ps.master.ps_address], TOKEN, give_up_after=120)
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


def test_two_clients_pushes_and_pulls_give_exact_values_on_one_connection_each(ps):
    first, second = client_for(ps), client_for(ps)
    first.initialize()
    for dense in (pull(first), pull(second)):
        np.testing.assert_array_equal(dense["w"], VALUE)

    rng = np.random.default_rng(1)
    expected = VALUE.copy()
    for key, client in enumerate([first, second, first]):
        grad = rng.standard_normal(VALUE.shape, dtype=np.float32)
        # "w" (2 MiB) travels beside the message, "b" (12 bytes) in it.
        push(client, key, {"w": grad, "b": np.ones(3, np.float32)})
        expected -= np.float32(LEARNING_RATE) * grad
        one, other = pull(first), pull(second)
        for name in ("w", "b"):
            assert one[name].dtype == other[name].dtype == np.float32
            np.testing.assert_array_equal(one[name], other[name])
        np.testing.assert_allclose(one["w"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(one["b"], np.full(3, -LEARNING_RATE * (key + 1)))
    assert first.versions[0] == second.versions[0] == 3
    # One persistent connection each for every exchange (a sender thread per shard).
    assert bulk_connections(first) == bulk_connections(second) == 1


def test_a_relaunched_ps_is_reached_again_over_the_bulk_channel(ps):
    client = client_for(ps)
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
