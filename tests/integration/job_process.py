"""A real PS (or worker) process of a one-PS job, started as a backend starts one, beside a
stub master that answers the one call a PS makes (ReportPsReady) and keeps the address it
reported. (A worker has no data here: it is for what a worker does before it trains.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import listen, make_server

TOKEN = "ps-test-token"
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
    """Answers the PS's ReportPsReady, the only master call a PS makes, and keeps the
    address the PS reported (where the client finds it)."""

    def __init__(self, token: str = TOKEN, identity: str = "master"):
        self.ready = threading.Semaphore(0)
        self.ps_address = ""
        stub_master = self

        class Servicer(rpc.MasterServicer):
            def ReportPsReady(self, request, context):
                stub_master.ps_address = request.address
                stub_master.ready.release()
                return pb.Empty()

        self.server = make_server(token, identity, threads=2)
        rpc.add_MasterServicer_to_server(Servicer(), self.server)
        self.address = f"127.0.0.1:{listen(self.server, '127.0.0.1:0')}"
        self.server.start()


def prepare_job_dir(job_dir: Path) -> None:
    """The files of a one-PS, one-worker job with no data, in a new `job_dir`: enough
    for its worker and PS to start (and wait for a master)."""
    from elasticdl_nb.capture import write_bundle
    from elasticdl_nb.spec import JobSpec

    job_dir.mkdir(parents=True)
    spec = JobSpec.from_options(data=["unused"], ps=1, workers=1, checkpoint_steps=10**9)
    (job_dir / "spec.json").write_text(spec.to_json())
    (job_dir / "sources.json").write_text('{"train": [], "validation": []}')
    (job_dir / "sgd_model.py").write_text(MODEL_FILE)
    write_bundle(
        job_dir / "bundle", model_zoo=str(job_dir / "sgd_model.py"), model_def="custom_model"
    )


class JobProcess:
    """`python -m elasticdl_nb.runtime.<role> --id 0` of a one-PS job, as a backend starts
    it; its output goes to `<role>.log` in the job directory."""

    def __init__(self, job_dir: Path, master: StubMaster, role: str = "ps"):
        prepare_job_dir(job_dir)
        self.job_dir, self.master, self.role, self.proc = job_dir, master, role, None
        self.log = job_dir / f"{role}.log"

    def start(self, wait: bool = True) -> None:
        from elasticdl_nb.runtime.lifeline import PARENT_ENV
        from elasticdl_nb.runtime.process_env import ProcessEnv

        env = ProcessEnv(TOKEN, self.job_dir, self.master.address, ())  # it binds a port
        environ = {**os.environ, **env.to_environ(), PARENT_ENV: str(os.getpid())}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"elasticdl_nb.runtime.{self.role}", "--id", "0"],
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if not wait:
            return
        for _ in range(600):
            if self.master.ready.acquire(timeout=0.5):
                return
            assert self.proc.poll() is None, self.log.read_text()
        raise AssertionError("the PS did not report ready")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
