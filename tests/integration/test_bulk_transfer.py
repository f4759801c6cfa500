"""The bulk channel with a real PS process: the same values as gRPC, and a PS restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import make_server
from elasticdl_nb.runtime.worker.ps_client import PsClient, PushPayload

pytestmark = pytest.mark.slow

TOKEN = "bulk-test-token"
LEARNING_RATE = 0.5
MODEL_FILE = f"""import tensorflow as tf

def custom_model():
    return tf.keras.Sequential([tf.keras.layers.Dense(1)])

def loss(labels, predictions):
    return tf.reduce_mean(tf.square(labels - predictions))

def optimizer():
    return tf.keras.optimizers.SGD({LEARNING_RATE})
"""


class StubMaster:
    """Answers the PS's ReportPsReady, the only master call a PS makes."""

    def __init__(self):
        self.ready = threading.Semaphore(0)
        ready = self.ready

        class Servicer(rpc.MasterServicer):
            def ReportPsReady(self, request, context):
                ready.release()
                return pb.Empty()

        self.server = make_server(TOKEN, threads=2)
        rpc.add_MasterServicer_to_server(Servicer(), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


class PsProcess:
    """`python -m elasticdl_nb.runtime.ps --id 0` of a one-PS job, as a backend starts it."""

    def __init__(self, job_dir: Path, master: StubMaster):
        from elasticdl_nb.model.bundle import write_bundle
        from elasticdl_nb.spec import JobSpec

        job_dir.mkdir(parents=True)
        spec = JobSpec.from_options(data=["unused"], ps=1, workers=1, checkpoint_steps=10**9)
        (job_dir / "spec.json").write_text(spec.to_json())
        (job_dir / "sgd_model.py").write_text(MODEL_FILE)
        write_bundle(
            job_dir / "bundle", model_zoo=str(job_dir / "sgd_model.py"), model_def="custom_model"
        )
        with socket.create_server(("127.0.0.1", 0)) as s:
            self.address = f"127.0.0.1:{s.getsockname()[1]}"
        self.job_dir, self.master, self.proc = job_dir, master, None

    def start(self) -> None:
        from elasticdl_nb.runtime.lifeline import PARENT_ENV
        from elasticdl_nb.runtime.process_env import ProcessEnv

        env = ProcessEnv(TOKEN, self.job_dir, self.master.address, (self.address,))
        environ = {**os.environ, **env.to_environ(), PARENT_ENV: str(os.getpid())}
        with open(self.job_dir / "ps.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "elasticdl_nb.runtime.ps", "--id", "0"],
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        for _ in range(600):
            if self.master.ready.acquire(timeout=0.5):
                return
            assert self.proc.poll() is None, (self.job_dir / "ps.log").read_text()
        raise AssertionError("the PS did not report ready")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def ps(tmp_path):
    master = StubMaster()
    ps = PsProcess(tmp_path / "job", master)
    ps.start()
    yield ps
    ps.stop()
    master.server.stop(0)


VALUE = np.random.default_rng(0).standard_normal((512, 1024), dtype=np.float32)  # 2 MiB


def client_for(ps: PsProcess, bulk: bool) -> PsClient:
    client = PsClient((ps.address,), TOKEN, give_up_after=120)
    if not bulk:
        client.bulk_threshold = 1 << 62
    client.set_model([("w", VALUE, False), ("b", np.zeros(3, np.float32), False)])
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
    assert stub.GetBulkEndpoint(pb.Empty(), timeout=10).port != old_port
    once = VALUE - np.float32(LEARNING_RATE)
    np.testing.assert_array_equal(dense["w"], once)
    assert client.versions[0] == 1
    push(client, 1, {"w": np.ones_like(VALUE)})  # redone after the crash: applied again
    np.testing.assert_array_equal(pull(client)["w"], once - np.float32(LEARNING_RATE))
