"""Simulated workers: many of a job's workers in one process, without TensorFlow, speaking
the real protocol to a real master and real parameter servers (bench/many_workers.py).

Each simulated worker does what a real one of a PS job does (runtime/worker/process.py,
trainer.py's exact mode, reporter.py), with the model's computation replaced by a sleep:

- it asks for tasks with numbered GetTask calls (10 s timeout, as `TaskRequests`); a
  `NONE` answer means sleep `wait_seconds`, or, holding the last push of its previous
  task, send that push first and ask again (as `_serve` does);
- for every minibatch of a training task: one exchange with the PS on its bulk channel
  (the previous minibatch's gradients and the pull for this one, in one frame), then
  `step_seconds` of "computing"; the last push of a task rides with the next task's
  first pull;
- it reports each pushed minibatch (its start, a loss, the PS version) from a reporter
  loop every 0.2 s, a task's end (with its `TaskTiming`) at once, an empty report as a
  heartbeat after 5 s of silence (the real Reporter's rates), each report numbered;
- calls that fail transiently (UNAVAILABLE, DEADLINE_EXCEEDED, the master busy) are
  retried with backoff and the same number (`patience.py`), and counted; a report
  answered `stop` ends the worker.

A worker here is a coroutine: one asyncio loop per process drives all of its workers,
each with its own gRPC channel to the master (its own connection, as a separate process
would have: a local subchannel pool) and its own TCP connection to the PS's bulk channel.
The frames are bulk.py's and frames.py's wire format, written with asyncio streams; this
model's tensors are all below `OUT_OF_BAND_MIN_BYTES`, so they travel inside the message,
as the real client sends them.

Run as `python simulated_workers.py` with a JSON `Setup` on its first stdin line
(`ELASTICDL_NB_TOKEN` in the environment); then one command per line: `{"op": "start",
"workers": [ids]}`, `{"op": "mark"}` (prints what was measured since the last mark, one
JSON line, and starts again), `{"op": "stop"}`. `Histogram` is the latency record both
sides use.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np

from elasticdl_nb.runtime.process_env import MASTER_PATIENCE
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV
from elasticdl_nb.runtime.protocol.channels import CLIENT_OPTIONS, host_of
from elasticdl_nb.runtime.protocol.frames import ERROR, MESSAGE, READY, hello
from elasticdl_nb.runtime.protocol.patience import transient
from elasticdl_nb.runtime.protocol.tensors import to_tensor
from elasticdl_nb.runtime.protocol.tls import MASTER, ps_name
from elasticdl_nb.runtime.worker.reporter import HEARTBEAT_SECONDS, NO_TASK, Reporter
from elasticdl_nb.runtime.worker.task_feed import GET_TASK_TIMEOUT

REPORT_INTERVAL = inspect.signature(Reporter).parameters["interval"].default
REPORT_TIMEOUT = 10.0  # as Reporter's calls
EXCHANGE_TIMEOUT = 60.0  # BulkClient's
# What protocol/auth.py's TokenAdder adds to every call.
_TOKEN_HEADER, _PEER_HEADER = "authorization", "elasticdl-peer"
# channels.py's client options, and a connection of the channel's own.
_CHANNEL_OPTIONS = [*CLIENT_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
_FRAME_HEAD = struct.Struct("!BII")  # frames.py: kind, message bytes, buffer count
LOOP_TICK = 0.05  # how often the loop's lag is sampled


# ---------------------------------------------------------------------------- records


class Histogram:
    """Durations in log-spaced buckets (5 % wide, from 10 µs): mergeable across processes
    and windows, percentiles to within a bucket."""

    FLOOR, GROWTH = 1e-5, 1.05

    def __init__(self, buckets: dict[int, int] | None = None):
        self.buckets: Counter[int] = Counter(buckets or {})

    def add(self, seconds: float) -> None:
        ratio = max(seconds, self.FLOOR) / self.FLOOR
        self.buckets[int(math.log(ratio) / math.log(self.GROWTH))] += 1

    def merge(self, other: Histogram) -> None:
        self.buckets.update(other.buckets)

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100) in seconds: the middle of its bucket."""
        total = self.count
        if not total:
            return None
        rank, seen = q / 100 * total, 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return self.FLOOR * self.GROWTH ** (index + 0.5)
        return None

    def to_json(self) -> dict[str, int]:
        return {str(k): v for k, v in self.buckets.items()}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> Histogram:
        return cls({int(k): v for k, v in data.items()})


class Window:
    """The `Measured` that workers record into now; `mark` starts a new one."""

    def __init__(self) -> None:
        self.now = Measured()

    def mark(self) -> Measured:
        done, self.now = self.now, Measured()
        return done


@dataclass
class Measured:
    """What this process's workers did since the last mark."""

    started: float = field(default_factory=time.monotonic)
    latency: dict[str, Histogram] = field(default_factory=dict)  # by call kind
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "call:CODE"

    def took(self, kind: str, seconds: float) -> None:
        self.latency.setdefault(kind, Histogram()).add(seconds)

    def to_json(self) -> dict:
        return {
            "seconds": time.monotonic() - self.started,
            "latency": {k: h.to_json() for k, h in self.latency.items()},
            "counts": dict(self.counts),
            "errors": dict(self.errors),
        }


# ---------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class Setup:
    """What every simulated worker of a process is given."""

    master: str  # the master's address
    step_seconds: float  # a minibatch's computation
    minibatch_size: int
    variables: list[tuple[str, list[int]]]  # the model's dense variables: name, shape
    # False: skip the PS (each minibatch counts as pushed at once), as if it had shards to
    # spare, so that only the master holds the workers back.
    exchange: bool = True

    def gradients(self) -> dict[str, pb.Tensor]:
        """One set of float32 gradients of the model's shapes, encoded once (small values:
        the PS applies them, and the model stays finite)."""
        rng = np.random.default_rng(os.getpid())
        return {
            name: to_tensor((rng.standard_normal(shape) * 1e-4).astype(np.float32))
            for name, shape in self.variables
        }


class BulkPeer:
    """One worker's connection to a PS's bulk channel: frames over an asyncio stream."""

    def __init__(self, host: str, port: int, token: str, peer: str):
        self.host, self.port, self.token, self.peer = host, port, token, peer
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._streams is None:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(hello(self.token, self.peer))
            if await reader.readexactly(len(READY)) != READY:
                raise ConnectionError(f"{self.peer} refused the bulk channel")
            self._streams = reader, writer
        return self._streams

    async def push_pull(self, request: pb.PushPullRequest) -> pb.PushPullResponse:
        reader, writer = await self._open()
        try:
            message = request.SerializeToString()
            writer.write(_FRAME_HEAD.pack(MESSAGE, len(message), 0) + message)
            await writer.drain()
            kind, size, count = _FRAME_HEAD.unpack(await reader.readexactly(_FRAME_HEAD.size))
            lengths = struct.unpack(f"!{count}Q", await reader.readexactly(8 * count))
            reply = await reader.readexactly(size)
            for n in lengths:  # (none for this model: every tensor is in the message)
                await reader.readexactly(n)
        except (OSError, asyncio.IncompleteReadError):
            self.close()
            raise
        if kind == ERROR:
            raise ConnectionError(bytes(reply).decode(errors="replace"))
        return pb.PushPullResponse.FromString(reply)

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


@dataclass
class _Pushed:
    """A computed minibatch whose gradients are not sent yet."""

    task: pb.Task
    start: int
    timing: pb.TaskTiming
    ends_task: bool = False


class SimulatedWorker:
    """One worker of a PS job, as the module docstring says: `run` until the job is over,
    the master tells it to stop, or the process does."""

    def __init__(
        self,
        worker_id: int,
        setup: Setup,
        token: str,
        gradients: dict[str, pb.Tensor],
        window: Window,
    ):
        self.worker_id, self.setup, self.window = worker_id, setup, window
        self._gradients = gradients
        self._metadata = ((_TOKEN_HEADER, f"Bearer {token}"), (_PEER_HEADER, MASTER))
        self._token = token
        self.channel = grpc.aio.insecure_channel(setup.master, options=_CHANNEL_OPTIONS)
        self.master = rpc.MasterStub(self.channel)
        self.ps: BulkPeer | None = None
        self.version = -1
        self.stopped = asyncio.Event()
        self._asks = 0
        self._reports_sent = 0
        self._pending: dict[int, pb.ProgressReport] = {}
        self._send_soon = asyncio.Event()
        self._last_sent = time.monotonic()
        self._unsent: _Pushed | None = None

    # ------------------------------------------------------------------ calls

    async def _call(self, kind: str, call, request, timeout: float):
        """A unary call to the master, retried with the same request while it fails
        transiently (as a channel with `MASTER_PATIENCE` does), each failure counted;
        returns (reply, seconds the answered try took)."""
        delay, deadline = MASTER_PATIENCE.first_delay, time.monotonic() + MASTER_PATIENCE.seconds
        while True:
            began = time.monotonic()
            try:
                reply = await call(request, timeout=timeout, metadata=self._metadata)
            except grpc.aio.AioRpcError as err:
                self.window.now.errors[f"{kind}:{err.code().name}"] += 1
                if not transient(err) or time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, MASTER_PATIENCE.max_delay)
                continue
            return reply, time.monotonic() - began

    async def _connect_ps(self) -> None:
        """Where PS 0 serves (GetPsAddresses), and its bulk port (GetBulkEndpoint)."""
        while True:
            addresses, _ = await self._call(
                "get_ps_addresses", self.master.GetPsAddresses, pb.Empty(), 10
            )
            if addresses.addresses and addresses.addresses[0]:
                break
            await asyncio.sleep(0.5)
        address, peer = addresses.addresses[0], ps_name(0)
        metadata = ((_TOKEN_HEADER, f"Bearer {self._token}"), (_PEER_HEADER, peer))
        async with grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS) as channel:
            stub = rpc.ParameterServerStub(channel)
            endpoint = await stub.GetBulkEndpoint(pb.Empty(), timeout=10, metadata=metadata)
        self.ps = BulkPeer(host_of(address), endpoint.port, self._token, peer)

    async def _exchange(self, push: _Pushed | None, learning_rate: float) -> float:
        """Push `push`'s gradients (if any) and pull, again on a new connection (and,
        after a few failures, at the PS's port asked again) until it goes through, as
        `PsClient` does; returns the seconds waited for the answer."""
        if not self.setup.exchange:
            self.window.now.counts["pushes" if push is not None else "pulls"] += 1
            if push is not None:
                self._batch_done(push)
            return 0.0
        request = pb.PushPullRequest(known_version=self.version, batch_key=-1)
        if push is not None:
            task = push.task
            request.epoch, request.source = task.epoch, task.range.source
            request.batch_key, request.learning_rate = push.start, learning_rate
            for name, tensor in self._gradients.items():
                request.dense_grads[name].CopyFrom(tensor)
        failures = 0
        while True:
            began = time.monotonic()
            try:
                reply = await asyncio.wait_for(self.ps.push_pull(request), EXCHANGE_TIMEOUT)
                break
            except (OSError, ConnectionError, asyncio.IncompleteReadError, TimeoutError) as exc:
                self.window.now.errors[f"exchange:{type(exc).__name__}"] += 1
                self.ps.close()
                failures += 1
                await asyncio.sleep(MASTER_PATIENCE.first_delay)
                if failures % 3 == 0:
                    await self._connect_ps()
        waited = time.monotonic() - began
        self.window.now.took("exchange", waited)
        self.window.now.counts["pushes" if push is not None else "pulls"] += 1
        self.version = reply.version
        if push is not None:
            self._batch_done(push)
        return waited

    # ------------------------------------------------------------------ the worker's life

    async def run(self) -> None:
        reporting = asyncio.create_task(self._report_loop())
        try:
            if self.setup.exchange:
                await self._connect_ps()
            await self._serve()
        except grpc.aio.AioRpcError as err:  # (retried for MASTER_PATIENCE first)
            self.window.now.counts[f"gave_up:{err.code().name}"] += 1
        except Exception as exc:  # noqa: BLE001 - a real worker would exit: counted, said
            self.window.now.counts[f"crashed:{type(exc).__name__}"] += 1
            print(f"worker {self.worker_id}: {exc!r}", file=sys.stderr, flush=True)
        finally:
            self.stopped.set()
            self._send_soon.set()
            await reporting
            if self.ps is not None:
                self.ps.close()
            await self.channel.close()

    async def _serve(self) -> None:
        while not self.stopped.is_set():
            self._asks += 1
            request = pb.GetTaskRequest(worker_id=self.worker_id, seq=self._asks)
            task, took = await self._call(
                "get_task", self.master.GetTask, request, GET_TASK_TIMEOUT
            )
            self.window.now.took(f"get_task:{pb.TaskType.Name(task.type).lower()}", took)
            if task.type != pb.TRAINING and self._unsent is not None:
                await self._flush_unsent()
                if task.type == pb.NONE:
                    continue  # that push may have completed the epoch: ask again at once
            if task.type == pb.FINISHED:
                self.window.now.counts["finished"] += 1
                return
            if task.type == pb.NONE:
                self.window.now.counts["no_task"] += 1
                await asyncio.sleep(task.wait_seconds or 0.2)
                continue
            self.window.now.counts["tasks"] += 1
            if task.type == pb.TRAINING:
                await self._train(task)
            else:  # (this job has no evaluation, prediction or export before it is stopped)
                self._report(task.task_id).task_done = True
                self._send_soon.set()

    async def _train(self, task: pb.Task) -> None:
        """Each minibatch: one exchange carrying the previous one's push, then its
        computation; the task's last push stays unsent for the next task's first pull."""
        timing, began = pb.TaskTiming(), time.monotonic()
        r, batch = task.range, self.setup.minibatch_size
        last = self._unsent
        for start in range(r.start, r.end, batch):
            if self.stopped.is_set():
                return
            timing.wait_seconds += await self._exchange(last, task.learning_rate)
            await asyncio.sleep(self.setup.step_seconds)
            timing.compute_seconds += self.setup.step_seconds
            timing.minibatches += 1
            last = _Pushed(task, start, timing)
        timing.task_seconds = time.monotonic() - began
        if last is not None:
            last.ends_task = last.task is task
        self._unsent = last

    async def _flush_unsent(self) -> None:
        pushed, self._unsent = self._unsent, None
        await self._exchange(pushed, pushed.task.learning_rate)

    # ------------------------------------------------------------------ reports

    def _report(self, task_id: int) -> pb.ProgressReport:
        report = self._pending.get(task_id)
        if report is None:
            report = self._pending[task_id] = pb.ProgressReport(
                worker_id=self.worker_id, task_id=task_id
            )
        return report

    def _batch_done(self, pushed: _Pushed) -> None:
        report = self._report(pushed.task.task_id)
        report.batch_starts.append(pushed.start)
        report.losses.add(loss=2.3, learning_rate=pushed.task.learning_rate)
        report.ps_versions[:] = [self.version]
        if pushed.ends_task:
            report.task_done = True
            report.timing.CopyFrom(pushed.timing)
            self._send_soon.set()  # (the trainer's task_done(wait=False))

    async def _report_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._send_soon.wait(), REPORT_INTERVAL)
            except TimeoutError:
                pass
            self._send_soon.clear()
            stopping = self.stopped.is_set()
            if not self._pending and time.monotonic() - self._last_sent > HEARTBEAT_SECONDS:
                self._report(NO_TASK)  # empty: a heartbeat
            reports, self._pending = list(self._pending.values()), {}
            try:
                for report in reports:
                    self._reports_sent += 1
                    report.seq = self._reports_sent
                    reply, took = await self._call(
                        "report", self.master.ReportProgress, report, REPORT_TIMEOUT
                    )
                    kind = "report:done" if report.task_done else "report"
                    self.window.now.took(kind, took)
                    self._last_sent = time.monotonic()
                    self.window.now.counts["reports"] += 1
                    if reply.stop and not self.stopped.is_set():
                        self.window.now.counts["told_to_stop"] += 1
                        self.stopped.set()
            except grpc.aio.AioRpcError as err:
                self.window.now.counts[f"gave_up:{err.code().name}"] += 1
                self.stopped.set()
            if stopping:
                return


# ---------------------------------------------------------------------------- the process


class Generator:
    """This process's workers, and what they measured."""

    def __init__(self, setup: Setup, token: str):
        self.setup, self.token = setup, token
        self.gradients = setup.gradients()
        self.window = Window()
        self.workers: dict[int, SimulatedWorker] = {}
        self.running: list[asyncio.Task] = []

    def start(self, ids: list[int]) -> None:
        for worker_id in ids:
            worker = SimulatedWorker(worker_id, self.setup, self.token, self.gradients, self.window)
            self.workers[worker_id] = worker
            self.running.append(asyncio.create_task(worker.run()))

    def mark(self) -> dict:
        done = self.window.mark()
        return {**done.to_json(), "workers": len(self.workers), "pid": os.getpid()}

    async def stop(self) -> None:
        for worker in self.workers.values():
            worker.stopped.set()
        if self.running:
            await asyncio.wait(self.running, timeout=15)

    async def watch_loop_lag(self) -> None:
        """How late the loop wakes a sleeper: the generator's own saturation."""
        while True:
            began = time.monotonic()
            await asyncio.sleep(LOOP_TICK)
            self.window.now.took("loop_lag", time.monotonic() - began - LOOP_TICK)


async def _main() -> None:
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[dict] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(commands.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(commands.put_nowait, {"op": "stop"})

    threading.Thread(target=read_stdin, daemon=True, name="commands").start()
    raw = await commands.get()
    setup = Setup(**{**raw, "variables": [tuple(v) for v in raw["variables"]]})
    generator = Generator(setup, os.environ[TOKEN_ENV])
    watcher = asyncio.create_task(generator.watch_loop_lag())
    while True:
        command = await commands.get()
        if command["op"] == "start":
            generator.start(command["workers"])
        elif command["op"] == "mark":
            print(json.dumps(generator.mark()), flush=True)
        elif command["op"] == "stop":
            await generator.stop()
            watcher.cancel()
            print(json.dumps(generator.mark()), flush=True)
            return


if __name__ == "__main__":
    asyncio.run(_main())
