"""Parameter transfer: push and pull of one dense float32 tensor of 1, 16 and 64 MiB
between a worker and a PS, against a plain TCP socket moving the same bytes on loopback.

    .venv/bin/python bench/transfer.py            # full run (~1 min on 2 cores)
    .venv/bin/python bench/transfer.py --quick    # fewer repeats

ours      A real PS process, `python -m elasticdl_nb.runtime.ps --id 0`, started the way
          the local backend starts it: a job directory (spec.json and a model bundle whose
          optimizer is plain SGD), the job's environment (token, job dir, addresses,
          parent pid) and the thread pins. A PS needs a master only to answer its
          ReportPsReady, so a stub Master (our make_server, token check) answers that and
          tells us the PS is up. One single-PS job per size, so the PS holds just the one
          N MiB variable; the three PS start together, before any timing. Periodic
          checkpoints are off (checkpoint_steps = 1e9) and the initial one is awaited
          (Checkpoint RPC). The client is our PsClient (channel, token, tensor encoding,
          sender thread) in this process, after set_model + initialize:
            push: exchange() with an N MiB gradient and known_version = the version the
                  push creates, so the reply carries no dense values. Includes the PS
                  applying SGD to N MiB.
            pull: exchange() without gradients and known_version = -1: the PS sends the
                  N MiB variable, the client decodes it (to_array).
baseline  A separate process (this script with --socket-server) on 127.0.0.1, TCP_NODELAY,
          preallocated buffers, sendall / recv_into. push: a 9-byte header + N MiB, then a
          1-byte ack back; pull: a 9-byte request, then N MiB back.

Per size: warm-up, then repeats alternating ours push, ours pull, baseline push, baseline
pull. MB/s = N MiB / wall seconds of one call (MB = 2**20 bytes). Ratio = median(ours) /
median(baseline); the issue's target is >= 0.5 at 64 MiB. Details carry every latency and
the PS-side compute measured in this process with the same ParameterStore and optimizer
(no transport): `store.push` (SGD on N MiB) and `store.read_dense` (the copy out).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import harness

harness.pin_threads()  # before anything imports TensorFlow

from elasticdl_nb.runtime.heap import keep_freed_memory  # noqa: E402

keep_freed_memory()  # the client stands in for a worker, which does this first (heap.py)

import numpy as np  # noqa: E402

SIZES_MB = (1, 16, 64)
MB = 2**20
HEADER = struct.Struct("!cQ")  # op (b"P" push, b"G" pull), payload bytes
MODEL_FILE = """import tensorflow as tf

def custom_model():
    return tf.keras.Sequential([tf.keras.layers.Dense(1)])

def loss(labels, predictions):
    return tf.reduce_mean(tf.square(labels - predictions))

def optimizer():
    return tf.keras.optimizers.SGD(1e-4)
"""


# ---------------------------------------------------------------------------- baseline


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("peer closed")
        got += n


def socket_server() -> None:
    """The baseline's peer: one connection, served until it closes."""
    from elasticdl_nb.runtime.lifeline import die_with_parent

    die_with_parent()
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    inbox = memoryview(bytearray(max(SIZES_MB) * MB))
    outbox = memoryview(bytearray(max(SIZES_MB) * MB))
    header = memoryview(bytearray(HEADER.size))
    try:
        while True:
            recv_exact(conn, header)
            op, size = HEADER.unpack(header)
            if op == b"P":
                recv_exact(conn, inbox[:size])
                conn.sendall(b"k")
            else:
                conn.sendall(outbox[:size])
    except EOFError:
        pass


class SocketClient:
    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [harness.PY, __file__, "--socket-server"], env=env, stdout=subprocess.PIPE
        )
        try:
            port = int(self.proc.stdout.readline())
            self.sock = socket.create_connection(("127.0.0.1", port))
        except Exception:
            stop(self.proc)
            raise
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbox = memoryview(bytearray(max(SIZES_MB) * MB))
        self.ack = memoryview(bytearray(1))

    def push(self, payload: np.ndarray) -> float:
        start = time.perf_counter()
        self.sock.sendall(HEADER.pack(b"P", payload.nbytes))
        self.sock.sendall(memoryview(payload).cast("B"))
        recv_exact(self.sock, self.ack)
        return time.perf_counter() - start

    def pull(self, nbytes: int) -> float:
        start = time.perf_counter()
        self.sock.sendall(HEADER.pack(b"G", nbytes))
        recv_exact(self.sock, self.inbox[:nbytes])
        return time.perf_counter() - start

    def close(self) -> None:
        self.sock.close()
        stop(self.proc)


# ---------------------------------------------------------------------------- ours


def stop(*procs: subprocess.Popen) -> None:
    """SIGTERM all, then SIGKILL whatever is still there after 10 s."""
    from elasticdl_nb.backends.local.processes import terminate

    terminate(list(procs), 10)


def make_job_dir(root: Path) -> Path:
    """A single-PS job's directory, as the local backend writes it (no data is read)."""
    from elasticdl_nb.capture import write_bundle
    from elasticdl_nb.spec import JobSpec

    root.mkdir(parents=True)
    spec = JobSpec.from_options(data=["unused"], ps=1, workers=1, checkpoint_steps=10**9)
    (root / "spec.json").write_text(spec.to_json())
    (root / "sgd_model.py").write_text(MODEL_FILE)
    write_bundle(root / "bundle", model_zoo=str(root / "sgd_model.py"), model_def="custom_model")
    return root


class StubMaster:
    """Our gRPC server with the job token, answering only the PS's ReportPsReady (one PS
    per stub master): it keeps the address the PS bound. With `tls_dir` (a job's TLS
    files, bench/tls_cost.py) it serves TLS as the job's master."""

    def __init__(self, token: str, tls_dir: Path | None = None):
        from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
        from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
        from elasticdl_nb.runtime.protocol.channels import listen, make_server
        from elasticdl_nb.runtime.protocol.tls import MASTER, JobTls

        self.ready = threading.Event()
        self.ps_address = ""
        stub_master = self

        class Servicer(rpc.MasterServicer):
            def ReportPsReady(self, request: Any, context: Any) -> Any:
                stub_master.ps_address = request.address
                stub_master.ready.set()
                return pb.Empty()

        self.server = make_server(token, "master", threads=2)
        rpc.add_MasterServicer_to_server(Servicer(), self.server)
        tls = JobTls.load(tls_dir, MASTER) if tls_dir else None
        self.address = f"127.0.0.1:{listen(self.server, '127.0.0.1:0', tls)}"
        self.server.start()

    def wait(self, proc: subprocess.Popen, timeout: float = 180) -> str:
        """The address of the PS `proc` once it has reported ready."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(timeout=0.2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("a PS did not start; see its ps.log in the job dir")
        return self.ps_address


def start_ps(
    job_dir: Path, token: str, master_addr: str, tls_dir: Path | None = None
) -> subprocess.Popen:
    """`python -m elasticdl_nb.runtime.ps --id 0` with the environment a backend gives it
    (it binds a port of its own and reports it to the master); with `tls_dir`, a PS of a
    job with TLS."""
    from elasticdl_nb.runtime.lifeline import PARENT_ENV
    from elasticdl_nb.runtime.process_env import ProcessEnv

    env = ProcessEnv(token, job_dir, master_addr, (), tls_dir=tls_dir).to_environ()
    env = harness.pinned_env({**env, PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"})
    with open(job_dir / "ps.log", "ab") as out:
        proc = subprocess.Popen(
            [harness.PY, "-m", "elasticdl_nb.runtime.ps", "--id", "0"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc


class OursClient:
    def __init__(self, address: str, token: str, value: np.ndarray, tls=None):
        from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
        from elasticdl_nb.runtime.worker.ps_client import PsClient, PushPayload

        self.payload = PushPayload
        self.client = PsClient(lambda: [address], token, tls=tls)
        self.client.set_model([("w", value)], [])
        self.client.initialize()
        self.client.exchange(None, {})  # learn the version
        self.client.stubs[0].Checkpoint(pb.Empty(), timeout=120)  # initial save done
        self.key = 0

    def push(self, grad: np.ndarray) -> float:
        self.key += 1
        push = self.payload(0, 0, self.key, self.key + 1, {"w": grad}, {}, False)
        client = self.client
        expected = client.versions[0] + 1  # the version this push creates
        client.versions[0] = expected  # known_version: so no dense values come back
        start = time.perf_counter()
        dense, _ = client.exchange(push, {})
        seconds = time.perf_counter() - start
        assert dense is None and client.versions[0] == expected, "push not applied alone"
        return seconds

    def pull(self, nbytes: int) -> float:
        client = self.client
        client.versions[0] = -1  # older than any version: the PS sends the variable
        start = time.perf_counter()
        dense, _ = client.exchange(None, {})
        seconds = time.perf_counter() - start
        assert dense is not None and dense["w"].nbytes == nbytes
        return seconds


def store_costs(job_dir: Path, value: np.ndarray, grad: np.ndarray, reps: int) -> dict:
    """SGD apply and dense read of N MiB in our ParameterStore, without any transport."""
    import tensorflow as tf

    from elasticdl_nb.model import load_bundle
    from elasticdl_nb.runtime.ps.store import ParameterStore, VariableSpec

    tf.get_logger().setLevel("ERROR")  # one store per size: TF warns about the retracing

    store = ParameterStore(load_bundle(job_dir / "bundle").optimizer, 0, 1)
    store.init([VariableSpec("w", value.copy())])
    applies, reads = [], []
    for key in range(reps + 2):
        start = time.perf_counter()
        store.push(0, 0, key, {"w": grad}, {}, None)
        mid = time.perf_counter()
        store.read_dense()
        applies.append(mid - start)
        reads.append(time.perf_counter() - mid)
    return {"apply_s": harness.stats(applies[2:]), "read_s": harness.stats(reads[2:])}


# ---------------------------------------------------------------------------- main


def measure(ours: OursClient, base: SocketClient, grad: np.ndarray, reps: int) -> dict:
    """Latencies (s) of `reps` rounds of ours push, ours pull, baseline push, baseline pull,
    after two warm-up rounds."""
    laps: dict[str, list[float]] = {
        k: [] for k in ("ours_push", "ours_pull", "base_push", "base_pull")
    }
    for rep in range(2 + reps):
        lap = {
            "ours_push": ours.push(grad),
            "ours_pull": ours.pull(grad.nbytes),
            "base_push": base.push(grad),
            "base_pull": base.pull(grad.nbytes),
        }
        if rep >= 2:
            for key, seconds in lap.items():
                laps[key].append(seconds)
    return laps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--socket-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.socket_server:
        socket_server()
        return
    began = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the clean-up below
    reps = {1: 10, 16: 8, 64: 6} if not args.quick else {1: 3, 16: 2, 64: 2}
    token = secrets.token_hex(16)
    rows: list[dict] = []
    details: dict[str, Any] = {"repeats": reps}
    tmp = Path(tempfile.mkdtemp(prefix="edl-transfer-"))
    procs: list[subprocess.Popen] = []
    masters: dict[int, StubMaster] = {}
    base = None
    try:
        base = SocketClient(harness.pinned_env())
        procs.append(base.proc)
        harness.log("starting one PS per size (1 PS per job, 3 jobs)")
        jobs = {size: make_job_dir(tmp / f"job-{size}mib") for size in SIZES_MB}
        servers = {}
        for size in SIZES_MB:
            masters[size] = StubMaster(token)
            procs.append(start_ps(jobs[size], token, masters[size].address))
        for size, proc in zip(SIZES_MB, procs[1:]):
            servers[size] = masters[size].wait(proc)
        harness.log(f"all PS up after {time.monotonic() - began:.1f} s")
        rng = np.random.default_rng(0)
        values, grads = {}, {}
        for size in SIZES_MB:
            values[size] = rng.standard_normal(size * MB // 4, dtype=np.float32)
            grads[size] = rng.standard_normal(size * MB // 4, dtype=np.float32)
            ours = OursClient(servers[size], token, values[size])
            laps = measure(ours, base, grads[size], reps[size])
            details[f"{size} MiB latency_s"] = {k: harness.stats(v) for k, v in laps.items()}
            for direction in ("push", "pull"):
                rows.append(
                    harness.row(
                        case=f"{direction} {size} MB",
                        metric="throughput",
                        unit="MB/s",
                        ours=[size / s for s in laps[f"ours_{direction}"]],
                        baseline=[size / s for s in laps[f"base_{direction}"]],
                        baseline_label="plain TCP socket",
                        higher_is_better=True,
                        target=0.5 if size == 64 else None,
                    )
                )
                harness.log(harness.describe(rows[-1]))
        base.close()
        stop(*procs)  # before the in-process measurement, so their exits do not disturb it
        harness.log("PS-side compute without transport (ParameterStore in this process)")
        for size in SIZES_MB:
            store = store_costs(jobs[size], values[size], grads[size], reps[size])
            details[f"{size} MiB store_s"] = store
            lat = details[f"{size} MiB latency_s"]
            for direction, part in (("push", "apply_s"), ("pull", "read_s")):
                rest = lat[f"ours_{direction}"]["median"] - store[part]["median"]
                details[f"{size} MiB {direction} ratio without PS compute"] = (
                    lat[f"base_{direction}"]["median"] / rest if rest > 0 else None
                )
    finally:
        if base is not None:
            base.close()
        stop(*procs)
        for master in masters.values():
            master.server.stop(0)
        shutil.rmtree(tmp, ignore_errors=True)
    details["note"] = (
        "MB = MiB (2**20 bytes). 'store_s': SGD apply (store.push) and dense read "
        "(store.read_dense) of the same N MiB in our ParameterStore, no gRPC: the compute "
        "part of ours' push and pull. '<size> <dir> ratio without PS compute': "
        "baseline median / (ours median - store median), i.e. transport alone."
    )
    harness.write_result(
        "transfer",
        "Parameter transfer: worker <-> PS vs plain TCP socket",
        rows,
        details,
        command=".venv/bin/python bench/transfer.py" + (" --quick" if args.quick else ""),
        seconds=round(time.monotonic() - began, 1),
    )


if __name__ == "__main__":
    main()
