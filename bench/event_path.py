"""Event path: latency from a master journal append to the client's `Job.events()` iterator.

    .venv/bin/python bench/event_path.py            # full run (~1 min)
    .venv/bin/python bench/event_path.py --quick    # one short repeat (~15 s)

Issue 3's target: p99 < 250 ms at 1,000 events/s.

ours      A driver process plays the master: it builds the master's real `Journal`
          (writing `events.jsonl`), a real `JobMaster` (no data, no PS, no instances; its
          coordinator is not started) and the real `MasterService`, served by
          `make_server(token, "master")` with the job's token, and registers itself in
          `master.json` of a job created with the real registry under a temporary
          ELASTICDL_NB_HOME. This process then reads the stream through the public SDK,
          `edl.attach(name).events(follow=True)`. Once the stream delivers the driver's
          first event (so it is live), the driver appends `loss` events at a fixed rate on
          an absolute schedule (event i is due at start + i / rate) for a fixed time, then
          stops the master (`JobMaster.stop`, the final `job_state` event) and closes the
          journal, which ends the stream. Latency per event = `time.time()` right after
          `events()` yields it minus `Event.time`, which `Journal.append` stamps with
          `time.time()`; both processes are on one machine, so the clocks agree.
          Every sequence number must arrive once, in order.
bare gRPC A raw server-streaming RPC with no journal, no token, no JSON and no SDK layer: the
          appender puts (seq, time) on a queue that the handler drains into `pb.Event`
          messages; the client is a plain channel. Same rate, schedule and clock: the
          floor that Python gRPC alone gives on this machine (informative baseline).

Three repeats of each (alternating, a fresh driver process each), plus one run of ours at
100 events/s for context. Rows give the per-repeat p99 and p50 and the count of events lost,
duplicated or out of order (limit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

from harness import PY, ROOT, log, percentile, pin_threads, pinned_env, row, write_result

from elasticdl_nb.backends.job_records import HOME_ENV

NAME = "event_path"
CASE = "journal append -> Job.events(), 1k events/s"
LIMIT_MS = 250.0
BARE_METHOD = "/bench.Bare/Stream"

# `JobRecord.master_alive` accepts a pid only if its command line names
# the master's module, MASTER_MODULE (a guard against pid reuse), so the driver is started
# with -c code that names that module rather than as `python bench/event_path.py`.
LAUNCH = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "import elasticdl_nb.backends.master_process; "
    "from event_path import drive; drive(*sys.argv[2:])"
)


# ---------------------------------------------------------------------------- driver side


def paced_appends(append: Callable[[int], None], rate: float, seconds: float) -> dict:
    """Call append(i) for i = 0..n-1, event i due at start + i / rate (no drift)."""
    n = int(rate * seconds)
    start = time.perf_counter()
    late = []
    for i in range(n):
        due = start + i / rate
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        late.append(time.perf_counter() - due)
        append(i)
    span = time.perf_counter() - start
    return {
        "appended": n,
        "append_rate": round(n / span, 1),
        "append_late_p99_ms": round(percentile(late, 99) * 1e3, 3),
    }


class NoInstances:
    """The driver's launcher: this master starts no instances."""

    def launch(self, role: str, instance_id: int, elastic: bool = False) -> None: ...
    def kill(self, role: str, instance_id: int, force: bool = False) -> None: ...
    def grow_memory(self, role: str) -> str | None: ...
    def shutdown(self, grace_seconds: float) -> None: ...


def serve_journal(job_dir: Path, rate: float, seconds: float) -> dict:
    """The master's journal and service, as `elasticdl_nb.runtime.master.serve` builds them."""
    from elasticdl_nb.runtime.job_dir import write_json
    from elasticdl_nb.runtime.master.assembly import build_master
    from elasticdl_nb.runtime.master.journal import Journal
    from elasticdl_nb.runtime.master.service import MasterService
    from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
    from elasticdl_nb.runtime.protocol.auth import token_from_env
    from elasticdl_nb.runtime.protocol.channels import listen, make_server
    from elasticdl_nb.spec import JobSpec

    token = token_from_env()
    journal = Journal(job_dir / "events.jsonl")
    master = build_master(
        JobSpec(), job_dir, journal, token=token, train=[], validation=[],
        launcher_for=lambda on_event: NoInstances(),
    )  # fmt: skip
    server = make_server(token, "master", threads=64)
    rpc.add_MasterServicer_to_server(MasterService(master), server)
    address = f"127.0.0.1:{listen(server, '127.0.0.1:0')}"
    server.start()
    write_json(job_dir / "master.json", {"address": address, "pid": os.getpid()})
    journal.append("job_state", state="running", reason="started")
    print("ready", flush=True)
    sys.stdin.readline()  # the client has received the first event: its stream is live
    result = paced_appends(
        lambda i: journal.append("loss", worker=0, points=[[i + 1, 0.5]]), rate, seconds
    )
    master.stop("benchmark done")
    journal.close()  # the stream delivers what is left and ends
    server.stop(grace=5).wait()
    return result


def serve_bare(rate: float, seconds: float) -> dict:
    """A plain gRPC server stream fed from a queue: no journal, token, JSON or SDK."""
    import grpc

    from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb

    events: queue.SimpleQueue = queue.SimpleQueue()

    def stream(request: Any, context: Any) -> Iterator[pb.Event]:
        while (item := events.get()) is not None:
            yield pb.Event(seq=item[0], time=item[1], kind=item[2])

    server = grpc.server(futures.ThreadPoolExecutor(8))
    handler = grpc.unary_stream_rpc_method_handler(
        stream, response_serializer=pb.Event.SerializeToString
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("bench.Bare", {"Stream": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    events.put((0, time.time(), "job_state"))
    print(f"ready {port}", flush=True)
    sys.stdin.readline()
    result = paced_appends(lambda i: events.put((i + 1, time.time(), "loss")), rate, seconds)
    events.put((result["appended"] + 1, time.time(), "job_state"))  # closing, as ours has
    events.put(None)
    server.stop(grace=5).wait()
    return result


def drive(mode: str, where: str, rate: str, seconds: str) -> None:
    """The driver process's entry point (see LAUNCH); prints its append figures as JSON."""
    if mode == "journal":
        result = serve_journal(Path(where), float(rate), float(seconds))
    else:
        result = serve_bare(float(rate), float(seconds))
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------- client side


def ours_stream(name: str, seconds: float) -> Iterator[tuple[int, str, float]]:
    import elasticdl_nb as edl

    for event in edl.attach(name).events(follow=True, timeout=seconds + 60):
        yield event.seq, event.kind, event.time


def bare_stream(port: int, seconds: float) -> Iterator[tuple[int, str, float]]:
    import grpc

    from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(BARE_METHOD, response_deserializer=pb.Event.FromString)
        for message in call(b"", timeout=seconds + 60):
            yield message.seq, message.kind, message.time


def measure(mode: str, rate: float, seconds: float, home: Path, index: int) -> dict[str, Any]:
    """One run: a fresh driver, the stream read to its end, latency and delivery checks."""
    from elasticdl_nb.backends import job_records as registry
    from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV

    assert registry.home() == home, "the job registry must be the temporary one"
    extra = {registry.HOME_ENV: str(home)}
    where = "-"
    if mode == "journal":
        record = registry.create_job(f"event-path-{index}")
        extra[TOKEN_ENV] = record.token
        where = str(record.dir)
    args = [PY, "-c", LAUNCH, str(ROOT / "bench"), mode, where, str(rate), str(seconds)]
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=pinned_env(extra)
    )
    try:
        ready = proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"the {mode} driver did not start (exit code {proc.wait(10)})")
        if mode == "journal":
            stream = ours_stream(f"event-path-{index}", seconds)
        else:
            stream = bare_stream(int(ready[1]), seconds)
        seqs: list[int] = []
        latencies: list[float] = []
        for seq, kind, stamped in stream:
            received = time.time()
            seqs.append(seq)
            if kind == "loss":
                latencies.append(received - stamped)
            elif len(seqs) == 1:  # the first event: the stream is live, start appending
                proc.stdin.write("go\n")
                proc.stdin.flush()
        driver = json.loads(proc.stdout.readline())
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    expected = driver["appended"] + 2  # the opening and the closing event around the appends
    out_of_order = sum(1 for a, b in zip(seqs, seqs[1:]) if b <= a)
    duplicated = len(seqs) - len(set(seqs))
    lost = len(set(range(expected)) - set(seqs))
    ms = [x * 1e3 for x in latencies]
    return {
        "mode": mode,
        "rate": rate,
        "seconds": seconds,
        **driver,
        "received": len(seqs),
        "lost": lost,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "bad": lost + duplicated + out_of_order,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "mean_ms": sum(ms) / len(ms),
    }


def summary(run: dict[str, Any]) -> str:
    return (
        f"{run['mode']} @ {run['rate']:g}/s: p50 {run['p50_ms']:.2f} ms, p99 "
        f"{run['p99_ms']:.2f} ms, max {run['max_ms']:.1f} ms; received {run['received']} of "
        f"{run['appended'] + 2} (lost {run['lost']}, dup {run['duplicated']}, out of order "
        f"{run['out_of_order']}); append rate {run['append_rate']:g}/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repeat")
    args = parser.parse_args()
    pin_threads()
    began = time.perf_counter()
    repeats, seconds, bare_seconds, low_seconds = (1, 4, 3, 3) if args.quick else (3, 10, 5, 5)
    home = Path(tempfile.mkdtemp(prefix="edl-event-path-"))
    os.environ[HOME_ENV] = str(home)  # jobs are registered there, never in ~/.elasticdl-nb
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "bare": []}
    try:
        for i in range(repeats):
            for key, mode, secs in (("ours", "journal", seconds), ("bare", "bare", bare_seconds)):
                runs[key].append(measure(mode, 1000.0, secs, home, i))
                log(summary(runs[key][-1]))
        low = measure("journal", 100.0, low_seconds, home, 99)
        log(summary(low))
    finally:
        shutil.rmtree(home, ignore_errors=True)
        os.environ.pop(HOME_ENV, None)
    ours, bare = runs["ours"], runs["bare"]
    rows = [
        row(CASE, "p99 latency", [r["p99_ms"] for r in ours], [r["p99_ms"] for r in bare],
            unit="ms", baseline_label="bare gRPC stream", higher_is_better=False,
            limit=LIMIT_MS),
        row(CASE, "p50 latency", [r["p50_ms"] for r in ours], [r["p50_ms"] for r in bare],
            unit="ms", baseline_label="bare gRPC stream", higher_is_better=False),
        row(CASE, "events lost or duplicated", [r["bad"] for r in ours], unit="events",
            higher_is_better=False, limit=0,
            note="also counts events out of order; every run must deliver every seq once"),
    ]  # fmt: skip
    details = {"ours_1k": ours, "bare_grpc_1k": bare, "ours_100_per_s": low}
    command = ".venv/bin/python bench/event_path.py" + (" --quick" if args.quick else "")
    total = time.perf_counter() - began
    write_result(NAME, "Event path latency", rows, details, command=command, seconds=total)
    log(f"done in {total:.1f} s")
    bad = [r for r in [*ours, low] if r["bad"]]
    assert not bad, f"events lost, duplicated or out of order: {bad}"


if __name__ == "__main__":
    main()
