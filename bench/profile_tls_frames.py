"""What TLS costs one bulk-channel exchange (bench/profiles.md, section 5): a client in
this process and an echo server in another send frames of a given size back and forth
(frames.py, as a worker and its PS do), in plaintext and in TLS with a job's
certificates, alternating. Per exchange: the round trip's wall time and each side's CPU.

    .venv/bin/python bench/profile_tls_frames.py                 # 2 KB, 30 KB, 100 KB
    .venv/bin/python bench/profile_tls_frames.py 100000 -n 40000

A CTR step's exchange (bench/workloads.py's CTR: 256 examples, 4 tables of 16 floats, a
64-32-1 dense part) carries ~100 KB each way. Not a `make bench` benchmark: it has no
baseline of another system, only the two transports of ours.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import socket
import statistics
import tempfile
import time
from pathlib import Path

from elasticdl_nb.runtime.protocol import tls
from elasticdl_nb.runtime.protocol.frames import (
    connect,
    listen_socket,
    recv_frame,
    secure_accepted,
    send_frame,
)

WARM_UP = 200


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _echo(listener: socket.socket, tls_dir: str | None, size: int, n: int, report) -> None:
    """Answer `n` + warm-up frames with frames of `size` bytes; report CPU per exchange."""
    job_tls = tls.JobTls.load(Path(tls_dir), tls.ps_name(0)) if tls_dir else None
    conn, _ = listener.accept()
    conn.settimeout(60)
    conn = secure_accepted(conn, job_tls)
    reply = b"y" * size
    for i in range(WARM_UP + n):
        if i == WARM_UP:
            cpu = _cpu_s()
        recv_frame(conn, 60, 60)
        send_frame(conn, reply)
    report.send((_cpu_s() - cpu) / n)
    conn.close()


def exchange(size: int, tls_dir: str | None, n: int) -> dict[str, float]:
    """µs per exchange of `size`-byte frames each way: wall, client CPU, server CPU."""
    listener = listen_socket("127.0.0.1")
    theirs, ours = multiprocessing.Pipe()
    server = multiprocessing.Process(
        target=_echo, args=(listener, tls_dir, size, n, theirs), daemon=True
    )
    server.start()
    job_tls = tls.JobTls.load(Path(tls_dir), tls.WORKER) if tls_dir else None
    sock = connect("127.0.0.1", listener.getsockname()[1], 60, job_tls, tls.ps_name(0))
    message = b"x" * size
    for i in range(WARM_UP + n):
        if i == WARM_UP:
            cpu, t0 = _cpu_s(), time.perf_counter()
        send_frame(sock, message)
        recv_frame(sock, 60, 60)
    wall, client = time.perf_counter() - t0, _cpu_s() - cpu
    server_cpu = ours.recv()
    sock.close()
    server.join()
    listener.close()
    return {
        "wall_us": wall / n * 1e6,
        "client_cpu_us": client / n * 1e6,
        "server_cpu_us": server_cpu * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sizes", nargs="*", type=int, default=[2_000, 30_000, 100_000])
    parser.add_argument("-n", type=int, default=20_000, help="exchanges per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tls.write(Path(tmp), tls.issue(tls.job_names(1), "profile"))
        for size in args.sizes:
            runs: dict[str, list[dict[str, float]]] = {"plain": [], "tls": []}
            for _ in range(args.repeats):
                for mode in runs:
                    runs[mode].append(exchange(size, tmp if mode == "tls" else None, args.n))
            for mode, results in runs.items():
                median = {k: statistics.median(r[k] for r in results) for k in results[0]}
                print(
                    f"{size:>8} B each way, {mode:<5}: round trip {median['wall_us']:6.1f} µs, "
                    f"CPU client {median['client_cpu_us']:6.1f} µs, "
                    f"server {median['server_cpu_us']:6.1f} µs"
                )


if __name__ == "__main__":
    main()
