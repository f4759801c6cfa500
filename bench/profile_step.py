"""Where one training step of the CTR model goes, phase by phase, in µs per step.

    .venv/bin/python bench/profile_step.py [--steps 400] [--batch 256] [--rounds 2]   (~1 min)

The worker's real `Trainer` (runtime/worker/trainer.py) runs real training tasks of
`minibatches_per_task` (8) minibatches each, in this one process, against a real
`ParameterServerService` + `ParameterStore` (the PS's classes). Nothing is re-implemented:
the step loop, the exchange, the PS's work are the runtime's own code, whatever its
current shape. A step's PushPull goes over the bulk channel (protocol/bulk.py: the
PsClient's `bulk[ps].push_pull(request, buffers)`, answered by the PS's
`ParameterServerService.push_pull`); gRPC carries only Init and the other control calls.
Passes:

  A. Phases. The PsClient's bulk client is replaced by a loopback that does to the
     messages what the channel does (SerializeToString on the sender, FromString on the
     receiver; out-of-band arrays are handed over as they are) and calls the service's
     push_pull directly, without transport; its gRPC stub by one that serves Init the same
     way. The PsClient's sender threads run inline in this pass, so every phase is timed
     on one thread. The runtime's methods are wrapped with timers where they exist:
     BatchMaker.batches, ModelRunner.probe_ids / train_step / load and their
     tf.functions, PsClient.start_exchange / exchange / result, the service's push_pull,
     ParameterStore.push / read / exchange and its compiled calls, EmbeddingTable.read /
     states / write, ... Each phase's time is exclusive (time in wrapped callees is
     subtracted), so the phases add up to the loop's total; what no wrapper covers is
     reported as "trainer loop: other".
  B. The same tasks, nothing wrapped: the real per-step time without transport.
  C. The same tasks over the real transport on 127.0.0.1: the PS's gRPC server
     (make_server / listen, token interceptors) for Init and GetBulkEndpoint and its
     BulkServer for the steps, the Trainer's real PsClient connecting as in a job, server
     and client in this one process. They share one GIL here, so this is not the
     two-process cost, but it adds the transport.
  D. The floor: one tf.function doing forward + backward + Adagrad.apply_gradients on a
     local model, in one process (what `model.fit` does per step, minus Keras' loop).
  E. The transport alone: PushPull round trips with a step-sized request to another
     process whose handler only returns a step-sized reply, on the bulk channel (a
     BulkClient against a BulkServer) and, for comparison, as a gRPC unary call (the
     PushPull method the runtime no longer has, registered by hand in the child).

Also: the PS checkpoint (ParameterStore.snapshot + CheckpointDir.save), taken every
`checkpoint_steps` (200) updates off the request path, amortized per step.
Writes bench/results/step_profile.md and step_profile.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import harness
from code_state import code_state  # bench/code_state.py, beside this script

harness.pin_threads()  # the same pins as every benchmark; before TensorFlow starts

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import workloads  # noqa: E402
from google.protobuf.message import Message  # noqa: E402

from elasticdl_nb.capture import write_bundle  # noqa: E402
from elasticdl_nb.data import resolve_sources, stage_arrays  # noqa: E402
from elasticdl_nb.model import load_bundle  # noqa: E402
from elasticdl_nb.runtime.process_env import ProcessEnv  # noqa: E402
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb  # noqa: E402
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc  # noqa: E402
from elasticdl_nb.runtime.protocol.bulk import BulkClient  # noqa: E402
from elasticdl_nb.runtime.protocol.bulk_server import BulkServer  # noqa: E402
from elasticdl_nb.runtime.protocol.channels import listen, make_server, open_channel  # noqa: E402
from elasticdl_nb.runtime.ps.checkpoints import CheckpointDir  # noqa: E402
from elasticdl_nb.runtime.ps.service import ParameterServerService  # noqa: E402
from elasticdl_nb.runtime.ps.store import ParameterStore  # noqa: E402
from elasticdl_nb.runtime.worker import ps_client as ps_client_module  # noqa: E402
from elasticdl_nb.runtime.worker.trainer import Trainer  # noqa: E402
from elasticdl_nb.spec import JobSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TOKEN = "bench-profile-token"


# ---------------------------------------------------------------------------- profiler


class Profiler:
    """Exclusive wall time per label: a wrapped call's time minus its wrapped callees'."""

    def __init__(self):
        self.exclusive: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.wrapped: list[str] = []
        self._local = threading.local()
        self.enabled = False

    def _stack(self) -> list[float]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def timed(self, label: str, fn, *args, **kwargs):
        if not self.enabled:
            return fn(*args, **kwargs)
        stack = self._stack()
        stack.append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            children = stack.pop()
            self.exclusive[label] += dt - children
            self.calls[label] += 1
            if stack:
                stack[-1] += dt

    def wrap(self, obj, attr: str, label: str) -> bool:
        """Time every call of obj.attr (set over it on the instance or class)."""
        inner = getattr(obj, attr, None)
        if inner is None or not callable(inner):
            return False
        profiler = self

        def timed(*args, **kwargs):
            return profiler.timed(label, inner, *args, **kwargs)

        setattr(obj, attr, timed)
        self.wrapped.append(
            f"{type(obj).__name__ if not isinstance(obj, type) else obj.__name__}.{attr}"
        )
        return True

    def wrap_generator(self, obj, attr: str, label: str) -> bool:
        """Time each next() of the generators obj.attr(...) returns."""
        inner = getattr(obj, attr, None)
        if inner is None:
            return False
        profiler = self

        def generator(*args, **kwargs):
            it = inner(*args, **kwargs)
            sentinel = object()
            while True:
                item = profiler.timed(label, next, it, sentinel)
                if item is sentinel:
                    return
                yield item

        setattr(obj, attr, generator)
        self.wrapped.append(f"{type(obj).__name__}.{attr}")
        return True


# ---------------------------------------------------------------------------- a PS in process


class _LoopbackBulk:
    """In place of a PsClient's BulkClient: does to a PushPull's messages what the bulk
    channel does and calls the service, without transport. With `captured`, keeps every
    (request, its buffers, reply, its buffers) as the PS and the worker saw them."""

    def __init__(self, service, profiler: Profiler, captured: list | None = None):
        self.service, self.profiler, self.captured = service, profiler, captured

    def push_pull(self, request, buffers=()):
        p, buffers = self.profiler, list(buffers)
        wire = p.timed("wire: request SerializeToString (worker side)", request.SerializeToString)
        received = p.timed(
            "wire: request FromString (PS side)", pb.PushPullRequest.FromString, wire
        )
        reply, out = p.timed(
            "PS: ParameterServerService.push_pull (its own Python)",
            self.service.push_pull,
            received,
            buffers,
        )
        wire = p.timed("wire: reply SerializeToString (PS side)", reply.SerializeToString)
        answer = p.timed(
            "wire: reply FromString (worker side)", pb.PushPullResponse.FromString, wire
        )
        if self.captured is not None:
            self.captured.append((received, buffers, answer, out))
        return answer, out

    def close(self):
        pass


class _LoopbackStub:
    """In place of a PsClient's gRPC stub: Init, through serialization, without transport."""

    def __init__(self, service):
        self._service = service

    def Init(self, request, timeout=None):
        return self._service.Init(pb.InitRequest.FromString(request.SerializeToString()), None)


def use_loopback(trainer: Trainer, service, profiler: Profiler, captured=None) -> None:
    trainer.ps.stubs = [_LoopbackStub(service)]
    trainer.ps.bulk = [_LoopbackBulk(service, profiler, captured)]


class _Inline:
    """An executor that runs what it is given at once, on the caller's thread."""

    def submit(self, fn, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as a thread would
            future.set_exception(exc)
        return future


class _Reporter:
    """What the Trainer needs of its Reporter, without a master."""

    def __init__(self):
        self.stop_requested = threading.Event()
        self.batches = 0

    def batch_done(self, task_id, start, loss, ps_versions, learning_rate=0.0):
        self.batches += 1

    def task_done(self, task_id, metric_states=None, timing=None, wait=True):
        pass


def _noop_update(force: bool = False):
    return None


def make_job_dir(ctr, n_records: int, batch: int, per_task: int, root: Path) -> Path:
    x, y, _ = ctr.make_ctr_data(n_records)
    job = root / "job"
    job.mkdir(parents=True)
    data_dir = stage_arrays(x, y, str(job / "data" / "train"))
    sources = resolve_sources([data_dir], "npy")
    spec = JobSpec.from_options(
        data=[data_dir],
        minibatch_size=batch,
        minibatches_per_task=per_task,
        workers=1,
        ps=1,
        model_zoo=str(ROOT / "examples/model_zoo/ctr.py"),
        model_def="ctr.custom_model",
        name="profile",
    )
    (job / "spec.json").write_text(spec.to_json())
    (job / "sources.json").write_text(
        json.dumps({"train": [s.to_dict() for s in sources], "validation": []})
    )
    write_bundle(job / "bundle", model_zoo=spec.model_zoo, model_def=spec.model_def)
    return job


def make_store(job: Path) -> ParameterStore:
    contract = load_bundle(job / "bundle")
    return ParameterStore(contract.optimizer, 0, 1)


def run_tasks(
    trainer: Trainer,
    n_records: int,
    batch: int,
    per_task: int,
    first_task: int,
    steps: int,
    epoch: int,
) -> int:
    """Run training tasks of `per_task` minibatches until `steps` minibatches are done."""
    span = batch * per_task
    done, task_id, start = 0, first_task, 0
    while done < steps:
        if start + span > n_records:
            start, epoch = 0, epoch + 1  # a new epoch: the PS must not drop them as redone
        task = pb.Task(
            task_id=task_id,
            type=pb.TRAINING,
            epoch=epoch,
            range=pb.RecordRange(source=0, start=start, end=start + span),
        )
        trainer.run(task)
        done += per_task
        task_id += 1
        start += span
    trainer.flush_unsent()  # the last task's last push (sent with the next pull otherwise)
    return epoch + 1


def instrument(p: Profiler, trainer: Trainer, service, store) -> None:
    runner, client = trainer.runner, trainer.ps
    p.wrap_generator(trainer.train_batches, "batches", "worker: read minibatch (BatchMaker)")
    for attr, label in [
        ("probe_ids", "worker: ModelRunner.probe_ids (Python: range check, .numpy)"),
        ("train_step", "worker: ModelRunner.train_step (Python: args, grads .numpy)"),
        ("load", "worker: ModelRunner.load (Python)"),
        ("_rows_args", "worker: ModelRunner._rows_args (pulled rows sorted by id)"),
        ("_probe", "worker: probe tf.function"),
        ("_train", "worker: train step, compiled (incl. loading the pulled params)"),
        ("_load", "worker: load tf.function"),
        ("_assign_dense", "worker: assign_dense tf.function"),
        ("_scatter_rows", "worker: scatter_rows tf.function"),
    ]:
        p.wrap(runner, attr, label)
    for attr, label in [
        ("start_exchange", "worker: PsClient.start_exchange (build request: to_tensor)"),
        ("exchange", "worker: PsClient.exchange (Python)"),
        ("_finish_exchange", "worker: PsClient reply decoding (to_array, concatenate)"),
    ]:
        p.wrap(client, attr, label)
    pending_cls = getattr(ps_client_module, "PendingExchange", None)
    if pending_cls is not None:
        p.wrap(pending_cls, "result", "worker: PendingExchange.result (Python)")
    for attr, label in [
        ("push", "PS: ParameterStore.push (Python)"),
        ("read", "PS: ParameterStore.read (Python, .numpy)"),
        ("exchange", "PS: ParameterStore.exchange (Python, .numpy)"),
        ("_apply", "PS: ParameterStore._apply (Python)"),
        ("_read", "PS: read tf.function"),
        ("_step", "PS: step, compiled (apply + read)"),
    ]:
        p.wrap(store, attr, label)
    for table in store.tables.values():
        for attr, label in [
            ("read", "PS: EmbeddingTable.read (pulled rows, numpy)"),
            ("states", "PS: EmbeddingTable.states (rows to update, numpy)"),
            ("write", "PS: EmbeddingTable.write (updated rows, numpy)"),
        ]:
            p.wrap(table, attr, label)
    p.wrap(trainer, "_batch_pushed", "worker: report to Reporter (stub)")


def new_trainer(job: Path, addr: str) -> Trainer:
    env = ProcessEnv(TOKEN, job, "", (addr,))
    return Trainer(env, 0, _Reporter(), lambda: [addr])


def profile_phases(job, n_records, batch, per_task, steps, warmup):
    p = Profiler()
    store = make_store(job)
    service = ParameterServerService(store, _noop_update, lambda: (0, ""))
    trainer = new_trainer(job, "127.0.0.1:1")  # lazy connections, never used
    use_loopback(trainer, service, p)
    # the sender threads run inline here, so that the times stay exclusive
    trainer.ps._senders = [_Inline() for _ in trainer.ps._senders]
    epoch = run_tasks(trainer, n_records, batch, per_task, 0, warmup, 0)  # builds, warms
    # wrap after the build: the PS's compiled calls exist once it is initialized
    instrument(p, trainer, service, store)
    p.enabled = True
    t0 = time.perf_counter()
    run_tasks(trainer, n_records, batch, per_task, 10_000, steps, epoch)
    total = time.perf_counter() - t0
    p.enabled = False
    return p, total, store


def profile_plain(job, n_records, batch, per_task, steps, warmup, transport: bool):
    store = make_store(job)
    service = ParameterServerService(store, _noop_update, lambda: (0, ""))
    server = bulk = None
    if transport:  # as runtime/ps/process.py serves a PS
        server = make_server(TOKEN, "ps-0")
        rpc.add_ParameterServerServicer_to_server(service, server)
        port = listen(server, "127.0.0.1:0")
        bulk = BulkServer("127.0.0.1", TOKEN, "ps-0", service.push_pull).start()
        service.bulk_port = bulk.port
        server.start()
        trainer = new_trainer(job, f"127.0.0.1:{port}")
    else:
        trainer = new_trainer(job, "127.0.0.1:1")
        use_loopback(trainer, service, Profiler())
    try:
        epoch = run_tasks(trainer, n_records, batch, per_task, 0, warmup, 0)
        t0 = time.perf_counter()
        run_tasks(trainer, n_records, batch, per_task, 10_000, steps, epoch)
        total = time.perf_counter() - t0
    finally:
        trainer.ps.bulk[0].close()
        if bulk is not None:
            bulk.stop()
        if server is not None:
            server.stop(grace=None)
    return total / steps * 1e6


def profile_floor(ctr, batch: int, steps: int, warmup: int) -> float:
    x, y, _ = ctr.make_ctr_data(batch * 100, seed=7)
    model, optimizer, loss_fn = ctr.custom_model(), ctr.optimizer(), ctr.loss

    @tf.function(reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    t0 = None
    for i in range(steps + warmup):
        if i == warmup:
            t0 = time.perf_counter()
        k = i % 100
        float(step(x[k * batch : (k + 1) * batch], y[k * batch : (k + 1) * batch]))
    return (time.perf_counter() - t0) / steps * 1e6


_ECHO_SERVER = r"""
import sys
import grpc
import numpy as np
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.bulk_server import BulkServer
from elasticdl_nb.runtime.protocol.channels import listen, make_server
token, workdir = sys.argv[1], sys.argv[2]
reply = pb.PushPullResponse.FromString(open(f"{workdir}/reply.bin", "rb").read())
with np.load(f"{workdir}/reply_buffers.npz") as z:
    buffers = [z[f"arr_{i}"] for i in range(len(z.files))]
inline = pb.PushPullResponse.FromString(open(f"{workdir}/reply_inline.bin", "rb").read())
bulk = BulkServer("127.0.0.1", token, "ps-0", lambda request, _: (reply, buffers)).start()
server = make_server(token, "ps-0")
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
    "elasticdl_nb.ParameterServer",
    {"PushPull": grpc.unary_unary_rpc_method_handler(
        lambda request, context: inline,
        request_deserializer=pb.PushPullRequest.FromString,
        response_serializer=pb.PushPullResponse.SerializeToString,
    )},
)])
port = listen(server, "127.0.0.1:0")
server.start()
print(bulk.port, port, flush=True)
sys.stdin.read()  # until the parent closes stdin
bulk.stop()
server.stop(grace=None)
"""


def inline(message, buffers):
    """A copy of `message` with the bytes of its out-of-band tensors in the message, as a
    gRPC call would carry them."""
    message = type(message).FromString(message.SerializeToString())

    def walk(msg) -> None:
        if isinstance(msg, pb.Tensor):
            if msg.out_of_band:
                msg.data = np.asarray(buffers[msg.out_of_band - 1]).tobytes()
                msg.out_of_band = 0
            return
        for _, value in msg.ListFields():
            if isinstance(value, Message):
                walk(value)
            elif hasattr(value, "values"):  # a map
                for item in value.values():
                    if isinstance(item, Message):
                        walk(item)
            elif not isinstance(value, (str, bytes)) and hasattr(value, "__iter__"):
                for item in value:
                    if isinstance(item, Message):
                        walk(item)

    walk(message)
    return message


def profile_round_trips(messages, workdir: Path, calls: int = 400) -> tuple[float, float]:
    """E. µs per PushPull round trip to another process whose handler does nothing but
    return a step-sized reply: the transport and (de)serialization cost alone, on the bulk
    channel and as a gRPC unary call."""
    request, request_buffers, reply, reply_buffers = messages
    (workdir / "reply.bin").write_bytes(reply.SerializeToString())
    np.savez(workdir / "reply_buffers.npz", *reply_buffers)
    (workdir / "reply_inline.bin").write_bytes(inline(reply, reply_buffers).SerializeToString())
    child = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER, TOKEN, str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        bulk_port, grpc_port = (int(v) for v in child.stdout.readline().split())
        client = BulkClient("127.0.0.1", TOKEN, "ps-0", lambda: bulk_port)
        for _ in range(30):
            client.push_pull(request, request_buffers)
        t0 = time.perf_counter()
        for _ in range(calls):
            client.push_pull(request, request_buffers)
        bulk = (time.perf_counter() - t0) / calls * 1e6
        client.close()

        channel = open_channel(f"127.0.0.1:{grpc_port}", TOKEN, "ps-0")
        push_pull = channel.unary_unary(
            "/elasticdl_nb.ParameterServer/PushPull",  # the package in elasticdl.proto
            request_serializer=pb.PushPullRequest.SerializeToString,
            response_deserializer=pb.PushPullResponse.FromString,
        )
        request = inline(request, request_buffers)
        for _ in range(30):
            push_pull(request, timeout=30)
        t0 = time.perf_counter()
        for _ in range(calls):
            push_pull(request, timeout=30)
        unary = (time.perf_counter() - t0) / calls * 1e6
        channel.close()
        return bulk, unary
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def step_messages(job, n_records, batch, per_task):
    """A typical steady-state exchange, the largest of a task's: (request, its
    out-of-band buffers, reply, its out-of-band buffers)."""
    store = make_store(job)
    service = ParameterServerService(store, _noop_update, lambda: (0, ""))
    trainer = new_trainer(job, "127.0.0.1:1")
    captured: list = []
    use_loopback(trainer, service, Profiler(), captured)
    run_tasks(trainer, n_records, batch, per_task, 0, per_task * 2, 0)
    return max(captured, key=lambda m: inline(m[0], m[1]).ByteSize())


def profile_checkpoint(store: ParameterStore, workdir: Path, repeats: int = 5) -> float:
    directory = CheckpointDir(workdir / "ckpt", 0, 3)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        directory.save(store.snapshot())
        times.append(time.perf_counter() - t0)
        store.version += 1  # a new file name each time
    return statistics.median(times) * 1e6


# The work of a step that a worker and a PS cannot do without, in series: the worker's
# compiled forward and backward pass, the PS's compiled update and its table rows, and one
# step-sized round trip on the socket. What is left of a step is our Python around them.
SERIES_PHASES = (
    "worker: train step, compiled",
    "PS: step, compiled",
    "PS: EmbeddingTable.",
)


def series_bound(phases_us: dict[str, float], round_trip_us: float) -> dict[str, float]:
    """µs per step of the series bound, from pass A's phases (µs per step) and E."""
    parts = {
        name: us for name, us in phases_us.items() if name.startswith(SERIES_PHASES) and us > 0
    }
    return {
        "parts_us": parts,
        "round_trip_us": round_trip_us,
        "bound_us": sum(parts.values()) + round_trip_us,
    }


def print_bound(args) -> None:
    """`--bound`: pass A and E only; prints `SERIES_BOUND {json}` (for bench/throughput.py)."""
    steps, warmup, batch, per_task = args.steps, args.warmup, args.batch, args.per_task
    steps -= steps % per_task
    warmup += -warmup % per_task
    n_records = batch * per_task * 25
    workdir = Path(tempfile.mkdtemp(prefix="edl-profile-"))
    try:
        job = make_job_dir(workloads.ctr_module(), n_records, batch, per_task, workdir)
        profiler, _, _ = profile_phases(job, n_records, batch, per_task, steps, warmup)
        phases = {n: secs / steps * 1e6 for n, secs in profiler.exclusive.items()}
        messages = step_messages(job, n_records, batch, per_task)
        round_trip, _ = profile_round_trips(messages, workdir, calls=200)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    bound = series_bound(phases, round_trip)
    bound["samples_per_s"] = batch / bound["bound_us"] * 1e6
    print("SERIES_BOUND " + json.dumps(bound), flush=True)


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:,.0f}" for v in values) + ")"


def _git() -> str:
    return code_state()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="200 steps, one round")
    parser.add_argument(
        "--bound", action="store_true", help="print only the series bound (pass A and E)"
    )
    args = parser.parse_args()
    if args.quick or args.bound:
        args.steps, args.rounds = 200, 1
    if args.bound:
        return print_bound(args)
    t_start = time.perf_counter()
    steps, warmup, batch, per_task = args.steps, args.warmup, args.batch, args.per_task
    steps -= steps % per_task
    warmup += -warmup % per_task
    n_records = batch * per_task * 25

    ctr = workloads.ctr_module()
    workdir = Path(tempfile.mkdtemp(prefix="edl-profile-"))
    job = make_job_dir(ctr, n_records, batch, per_task, workdir)
    print(
        f"CTR model, batch {batch}, tasks of {per_task} minibatches, {steps} timed steps "
        f"after {warmup} warm-up steps",
        flush=True,
    )

    # The machine is noisy: the passes alternate for --rounds rounds; the phases are
    # pooled over the rounds' A passes, the whole-step figures are medians.
    runs_a, runs_b, runs_c, runs_d = [], [], [], []
    pooled = Profiler()
    total_a = 0.0
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        profiler, seconds, store = profile_phases(job, n_records, batch, per_task, steps, warmup)
        total_a += seconds
        runs_a.append(seconds / steps * 1e6)
        for name, secs in profiler.exclusive.items():
            pooled.exclusive[name] += secs
            pooled.calls[name] += profiler.calls[name]
        pooled.wrapped = profiler.wrapped
        runs_b.append(profile_plain(job, n_records, batch, per_task, steps, warmup, False))
        runs_c.append(profile_plain(job, n_records, batch, per_task, steps, warmup, True))
        runs_d.append(profile_floor(ctr, batch, steps, warmup))
    profiler = pooled
    steps_a = steps
    steps *= args.rounds  # the pooled phases cover every round's steps
    loop_b, loop_c, floor = (statistics.median(x) for x in (runs_b, runs_c, runs_d))
    ckpt = profile_checkpoint(store, workdir)
    messages = step_messages(job, n_records, batch, per_task)
    request_bytes = inline(messages[0], messages[1]).ByteSize()
    reply_bytes = inline(messages[2], messages[3]).ByteSize()
    bulk_round_trip, grpc_round_trip = profile_round_trips(messages, workdir)

    total_us = total_a / steps * 1e6
    bound = series_bound(
        {n: secs / steps * 1e6 for n, secs in profiler.exclusive.items()}, bulk_round_trip
    )
    steps_text = f"{steps_a} steps × {args.rounds} rounds"
    phases = sorted(profiler.exclusive.items(), key=lambda kv: -kv[1])
    covered = sum(profiler.exclusive.values())
    rows = [(name, secs / steps * 1e6, profiler.calls[name] / steps) for name, secs in phases]
    rows.append(("trainer loop: other (unwrapped Python)", (total_a - covered) / steps * 1e6, 0))
    by_side = defaultdict(float)
    for name, us, _ in rows:
        by_side[name.split(":")[0]] += us

    lines = [
        "# One CTR training step, phase by phase",
        "",
        f"Command: `.venv/bin/python bench/profile_step.py --steps {args.steps} "
        f"--batch {batch} --rounds {args.rounds}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; code: git {_git()}; TensorFlow "
        f"{tf.__version__}; {os.cpu_count()} cores; load average "
        f"{[round(v, 2) for v in os.getloadavg()]}",
        "",
        "Model: examples/model_zoo/ctr.py (4 × Embedding(10000, 16) → 64 → 32 → 1, Adagrad), "
        f"batch {batch}, tasks of {per_task} minibatches, 1 PS. The worker's real `Trainer` "
        "runs real tasks against the real `ParameterServerService`/`ParameterStore` in one "
        "process (see the script's docstring).",
        "",
        f"## A. Phases, exclusive time (µs per step; {steps_text}, pooled)",
        "",
        "| phase | µs / step | calls / step | share |",
        "|---|---:|---:|---:|",
    ]
    for name, us, calls in rows:
        calls_text = f"{calls:.2f}" if calls else ""
        lines.append(f"| {name} | {us:,.0f} | {calls_text} | {us / total_us:.0%} |")
    lines.append(f"| **total (loop wall time)** | **{total_us:,.0f}** | | 100% |")
    lines += [
        "",
        "By side: " + ", ".join(f"{k} {v:,.0f} µs" for k, v in sorted(by_side.items())),
        "",
        "## Whole steps (µs per step, and the samples/s that implies)",
        "",
        "| loop | µs / step | samples/s |",
        "|---|---:|---:|",
        f"| A. instrumented (timers on); runs {_runs(runs_a)} | {total_us:,.0f} "
        f"| {batch / total_us * 1e6:,.0f} |",
        f"| B. real Trainer → loopback → real PS service, no transport, no timers; runs "
        f"{_runs(runs_b)} "
        f"| {loop_b:,.0f} | {batch / loop_b * 1e6:,.0f} |",
        f"| C. real Trainer → real bulk channel on 127.0.0.1 → real PS service, one process; "
        f"runs "
        f"{_runs(runs_c)} "
        f"| {loop_c:,.0f} | {batch / loop_c * 1e6:,.0f} |",
        f"| D. floor: one tf.function forward+backward+Adagrad apply, one process; runs "
        f"{_runs(runs_d)} "
        f"| {floor:,.0f} | {batch / floor * 1e6:,.0f} |",
        f"| E. one bulk-channel PushPull round trip to another process whose handler only "
        f"returns a step-sized reply (request {request_bytes:,} B, reply {reply_bytes:,} B): "
        f"`BulkClient.push_pull(...)` | {bulk_round_trip:,.0f} | |",
        f"| E'. the same over gRPC (a unary call), blocking | {grpc_round_trip:,.0f} | |",
        f"| S. series bound: {' + '.join(bound['parts_us'])} + E, each as measured above "
        f"(what a worker and a PS in series cannot do without) | {bound['bound_us']:,.0f} "
        f"| {batch / bound['bound_us'] * 1e6:,.0f} |",
        "",
        f"PS checkpoint (snapshot + np.savez + fsync), every 200 updates by default: "
        f"{ckpt:,.0f} µs each = {ckpt / 200:,.0f} µs per step amortized (off the request "
        "path; snapshot() holds the store lock while it copies).",
        "",
        "Wrapped: " + ", ".join(sorted(set(profiler.wrapped))) + ".",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "step_profile.md").write_text(text)
    (RESULTS / "step_profile.json").write_text(
        json.dumps(
            {
                "batch": batch,
                "per_task": per_task,
                "steps": steps,
                "code": _git(),
                "phases_us_per_step": {name: round(us, 1) for name, us, _ in rows},
                "calls_per_step": {name: calls for name, _, calls in rows},
                "instrumented_loop_us": total_us,
                "rounds": args.rounds,
                "instrumented_runs_us": runs_a,
                "loopback_runs_us": runs_b,
                "bulk_same_process_runs_us": runs_c,
                "floor_runs_us": runs_d,
                "loopback_loop_us": loop_b,
                "bulk_same_process_loop_us": loop_c,
                "single_process_floor_us": floor,
                "checkpoint_us": ckpt,
                "series_bound": bound,
                "bulk_round_trip_other_process_us": bulk_round_trip,
                "grpc_round_trip_other_process_us": grpc_round_trip,
                "request_bytes": request_bytes,
                "reply_bytes": reply_bytes,
            },
            indent=1,
        )
        + "\n"
    )
    shutil.rmtree(workdir, ignore_errors=True)
    harness.write_result(
        "profile_step",
        "One CTR step of the real worker loop against the single-process floor",
        [
            harness.row(
                "CTR step, real Trainer → real bulk channel → real PS service (one process)",
                "µs per step",
                runs_c,
                runs_d,
                unit="µs",
                baseline_label="floor: one tf.function fwd+bwd+apply",
                higher_is_better=False,
                note="phases in bench/results/step_profile.md",
            ),
            harness.row(
                "CTR step, real Trainer → in-process loopback → real PS service",
                "µs per step",
                runs_b,
                runs_d,
                unit="µs",
                baseline_label="floor: one tf.function fwd+bwd+apply",
                higher_is_better=False,
            ),
        ],
        {"phases_us_per_step": {name: round(us, 1) for name, us, _ in rows}},
        command=" ".join([".venv/bin/python bench/profile_step.py", *sys.argv[1:]]),
        seconds=time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    main()
