"""cProfile of a real CTR job's worker and PS, summarized as short text files.

    .venv/bin/python bench/profile_job.py [--tag after] [--from-dir DIR]

Runs the CTR workload (bench/workloads.py) as a 1 worker + 1 PS job with
`ELASTICDL_NB_PROFILE_DIR` set, so each job process profiles every one of its threads
(elasticdl_nb/runtime/profiling.py) and dumps the statistics when it exits. Then writes,
per role, `bench/profiles/<tag>-<role>.txt`: the functions of the hot path by cumulative
time, and the top functions by own time. `--from-dir` summarizes dumps made earlier
instead of running a job. cProfile slows Python-heavy code several times over, so read
the shares, not the absolute times; the job's samples/s under the profiler is printed.
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import shutil
import sys
import tempfile
from pathlib import Path

import harness

OUT = harness.ROOT / "bench" / "profiles"
# What the summaries keep: our runtime, TensorFlow's call machinery, gRPC's server loop.
HOT_PATH = (
    r"elasticdl_nb|polymorphic_function.py|concrete_function.py.*_call_flat|"
    r"atomic_function.py.*call_flat|function_type_utils|grpc/_server.py.*_unary_response|"
    r"grpc/_channel.py.*_blocking|convert_to_eager_tensor"
)


def run_job(profile_dir: Path) -> float:
    harness.pin_threads()
    os.environ["ELASTICDL_NB_PROFILE_DIR"] = str(profile_dir)
    import workloads  # after the pins: it imports TensorFlow

    with harness.job_home():
        ctr = workloads.workloads(quick=True)["ctr"]
        return workloads.run_job(ctr, 1, "profile")["samples_per_s"]


def summary(dump: Path, title: str) -> str:
    text = io.StringIO()
    stats = pstats.Stats(str(dump), stream=text)
    text.write(f"# {title}\n\n## hot path, by cumulative time\n")
    stats.sort_stats("cumulative").print_stats(HOT_PATH, 30)
    text.write("\n## top functions by own time\n")
    stats.sort_stats("tottime").print_stats(15)
    lines = [_short_paths(line.rstrip()) for line in text.getvalue().splitlines()]
    return "\n".join(line for line in lines if line and "List reduced" not in line) + "\n"


def _short_paths(line: str) -> str:
    """Paths from the package root on: '.../site-packages/tensorflow/x.py' -> 'tensorflow/x.py'."""
    for marker in ("site-packages/", "lib/python3.11/", str(harness.ROOT) + "/"):
        while marker in line:
            start = line.index(marker)
            head = line[:start]
            cut = max(head.rfind(" "), head.rfind("("), head.rfind("'")) + 1
            line = line[:cut] + line[start + len(marker) :]
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="current", help="file name prefix")
    parser.add_argument("--from-dir", type=Path, help="summarize existing dumps")
    args = parser.parse_args()
    directory = args.from_dir or Path(tempfile.mkdtemp(prefix="edl-prof-"))
    if args.from_dir is None:
        rate = run_job(directory)
        harness.log(f"CTR 1 worker + 1 PS under the profiler: {rate:,.0f} samples/s")
    OUT.mkdir(parents=True, exist_ok=True)
    for role in ("worker", "ps"):
        dumps = sorted(directory.glob(f"{role}-*.prof"), key=lambda p: p.stat().st_size)
        if not dumps:
            harness.log(f"no {role} profile in {directory}")
            continue
        path = OUT / f"{args.tag}-{role}.txt"
        path.write_text(summary(dumps[-1], f"{role}, CTR 1 worker + 1 PS ({args.tag})"))
        harness.log(f"wrote {path.relative_to(harness.ROOT)}")
    if args.from_dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
