"""What TLS costs a local job (issue 20): the same work with the job's connections in
mutual TLS and in plaintext, side by side in one run, alternating.

    .venv/bin/python bench/tls_cost.py            # full run (~9 min on 2 cores)
    .venv/bin/python bench/tls_cost.py --quick    # one run each, fewer repeats

- CTR 2 workers + 1 PS (bench/workloads.py's CTR, run as bench/throughput.py runs it):
  steady-state samples/s of the job with `tls=True` against the same job in plaintext,
  five pairs of runs, each pair's order the other way round from the one before.
- 64 MiB push and pull between a worker's PsClient in this process and a real PS process
  (bench/transfer.py's set-up): one PS of a job in plaintext, one of a job with TLS,
  calls alternating between the two after two warm-up rounds.

Ratio = TLS / plaintext (1.0: TLS is free). Targets (issue 37): 64 MiB push and pull at
least 0.6 of plaintext, the CTR job 0.95. Local jobs stay in plaintext by default (on loopback TLS
guards against nothing another local user could not read from the job directory anyway);
Kubernetes jobs always use TLS.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

harness.pin_threads()  # before anything imports TensorFlow
import transfer  # noqa: E402, I001  (first: it sets up the heap before any thread starts)

import numpy as np  # noqa: E402
import workloads  # noqa: E402

SIZE_MB = 64
PLAIN = "the same in plaintext"


def ctr_rows(quick: bool) -> tuple[list[dict], dict]:
    w = workloads.workloads(quick)["ctr"]
    runs: dict[str, list[dict]] = {"plain": [], "tls": []}
    # Five pairs, not three: single runs scatter by ±5 % here (five pairs on 2026-12-07:
    # TLS/plain 0.92-1.02), as wide as the cost measured (profiles.md, section 5). Each
    # pair's order alternates, so a drift of the machine favours neither.
    for rep in range(1 if quick else 5):
        for mode in ("plain", "tls") if rep % 2 == 0 else ("tls", "plain"):
            harness.log(f"ctr: 2 workers + 1 PS, {mode}, run {rep + 1}")
            out = workloads.run_job(w, 2, f"{mode}{rep}", tls=mode == "tls")
            runs[mode].append(out)
            harness.log(f"  -> {out['samples_per_s']:,.0f} samples/s")
    row = harness.row(
        case="CTR 2 workers + 1 PS, TLS",
        metric="throughput",
        unit="samples/s",
        ours=[r["samples_per_s"] for r in runs["tls"]],
        baseline=[r["samples_per_s"] for r in runs["plain"]],
        baseline_label=PLAIN,
        note="local backend; every connection of the job (gRPC, bulk channel) in TLS",
        target=0.95,
    )
    harness.log(harness.describe(row))
    return [row], {"ctr runs": runs}


def transfer_rows(quick: bool, tmp: Path) -> tuple[list[dict], dict]:
    from elasticdl_nb.runtime.protocol import tls

    reps = 2 if quick else 6
    token = secrets.token_hex(16)
    tls_dir = tmp / "tls"
    tls.write(tls_dir, tls.issue(tls.job_names(1), "bench"))
    worker_tls = tls.JobTls.load(tls_dir, tls.WORKER)
    masters: list[transfer.StubMaster] = []
    procs = []
    try:
        for mode, directory in (("plain", None), ("tls", tls_dir)):
            masters.append(transfer.StubMaster(token, directory))
            job_dir = transfer.make_job_dir(tmp / f"job-{mode}")
            procs.append(transfer.start_ps(job_dir, token, masters[-1].address, directory))
        addresses = [master.wait(proc) for master, proc in zip(masters, procs)]
        harness.log(f"both PS up: {addresses}")
        rng = np.random.default_rng(0)
        value = rng.standard_normal(SIZE_MB * transfer.MB // 4, dtype=np.float32)
        grad = rng.standard_normal(SIZE_MB * transfer.MB // 4, dtype=np.float32)
        clients = {
            "plain": transfer.OursClient(addresses[0], token, value),
            "tls": transfer.OursClient(addresses[1], token, value, tls=worker_tls),
        }
        laps: dict[str, list[float]] = {f"{m}_{d}": [] for m in clients for d in ("push", "pull")}
        for rep in range(2 + reps):
            lap = {}
            for mode, client in clients.items():
                lap[f"{mode}_push"] = client.push(grad)
                lap[f"{mode}_pull"] = client.pull(grad.nbytes)
            if rep >= 2:
                for key, seconds in lap.items():
                    laps[key].append(seconds)
    finally:
        transfer.stop(*procs)
        for master in masters:
            master.server.stop(0)
    rows = []
    for direction in ("push", "pull"):
        rows.append(
            harness.row(
                case=f"{direction} {SIZE_MB} MB, TLS",
                metric="throughput",
                unit="MB/s",
                ours=[SIZE_MB / s for s in laps[f"tls_{direction}"]],
                baseline=[SIZE_MB / s for s in laps[f"plain_{direction}"]],
                baseline_label=PLAIN,
                note="worker PsClient <-> a real PS process on loopback",
                target=0.6,
            )
        )
        harness.log(harness.describe(rows[-1]))
    return rows, {"64 MiB latency_s": {k: harness.stats(v) for k, v in laps.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run each, fewer repeats")
    args = parser.parse_args()
    began = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the clean-up below
    tmp = Path(tempfile.mkdtemp(prefix="edl-tls-"))
    details: dict[str, Any] = {}
    try:
        rows, details["transfer"] = transfer_rows(args.quick, tmp)
        with harness.job_home():
            ctr, details["ctr"] = ctr_rows(args.quick)
        rows += ctr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    harness.write_result(
        "tls_cost",
        "TLS on a local job: the same work in mutual TLS vs plaintext",
        rows,
        details,
        command=".venv/bin/python bench/tls_cost.py" + (" --quick" if args.quick else ""),
        seconds=round(time.monotonic() - began, 1),
    )


if __name__ == "__main__":
    main()
