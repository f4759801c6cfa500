"""A real CTR job's journal on disk (issue 39): what it writes an hour, and what it keeps.

    .venv/bin/python bench/ctr_journal.py            # 8 minutes of training (~9 min)
    .venv/bin/python bench/ctr_journal.py --quick    # 3 minutes, a cut every 5,000 events

The job: bench/workloads.py's CTR (examples/model_zoo/ctr.py, 4 x Embedding(10000, 16)
-> 64 -> 32 -> 1, Adagrad), 2 workers and 1 PS on the local backend, as many epochs as
fit, stopped after the time. Every 2 s the benchmark reads the journal's files:

ours      what is on disk: events-history.jsonl + events.jsonl + master.snapshot, the
          journal compacted every `journal_compact_every` events (20,000, the default).
baseline  what the journal would hold without compaction (every job before issue 39):
          the bytes of every event written, each read from events.jsonl before a cut
          moved it (a cut comes every 20,000 events, minutes apart; the reads are 2 s).

Per hour: the baseline grows by its bytes a second x 3,600; ours is the most it held
during the run (it does not grow with the hours once the first cut is made: the tail
holds at most `journal_compact_every` events, the history at most 4,096 of each thinned
kind and the events that grow with epochs and faults, bench/long_journal.py's 10 M).
"""

from __future__ import annotations

import argparse
import json
import time

import harness

harness.pin_threads()  # before anything imports TensorFlow
import workloads  # noqa: E402

from elasticdl_nb.runtime.job_dir import JobDir  # noqa: E402

NAME = "ctr_journal"


class JournalWatch:
    """Reads a job's journal files: the bytes of every event ever written (by number),
    and the bytes on disk now."""

    def __init__(self, files: JobDir):
        self.files = files
        self.written: dict[int, int] = {}  # seq -> its line's bytes

    def look(self) -> dict[str, float]:
        try:
            with open(self.files.events, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {"events": 0, "written_bytes": 0, "disk_bytes": 0}
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            if line.strip():
                seq = json.loads(line)["seq"]
                self.written.setdefault(seq, len(line) + 1)
        paths = (self.files.events, self.files.events_history, self.files.master_snapshot)
        disk = sum(p.stat().st_size for p in paths if p.exists())
        return {
            "events": len(self.written),
            "newest_seq": max(self.written, default=-1),
            "written_bytes": sum(self.written.values()),
            "disk_bytes": disk,
        }


def run(minutes: float, compact_every: int) -> dict:
    w = workloads.workloads(quick=True)["ctr"]
    job = w.train(
        workers=2,
        ps=1,
        name="bench-ctr-journal",
        epochs=1000,
        journal_compact_every=compact_every,
    )
    watch = JournalWatch(JobDir(job.dir))
    looks = []
    began = None
    try:
        while True:
            time.sleep(2.0)
            look = watch.look()
            if began is None:  # (from the first event on: not the job's start-up)
                if look["events"]:
                    began = time.monotonic()
                continue
            look["t"] = time.monotonic() - began
            looks.append(look)
            if look["t"] >= minutes * 60:
                break
            if job.status().get("state") not in ("running", "starting"):
                raise RuntimeError(f"the CTR job ended early: {job.status()}")
    finally:
        job.stop()
        job.wait(timeout=120, progress=False)
    last = looks[-1]
    cuts = [e for e in job.events(follow=False) if e.kind == "journal_compacted"]
    missed = last["newest_seq"] + 1 - last["events"]  # events cut before they were read
    return {
        "seconds": last["t"],
        "events": last["newest_seq"] + 1,
        "events_missed": missed,
        "events_per_s": (last["newest_seq"] + 1) / last["t"],
        "written_bytes": last["written_bytes"],
        "bytes_per_event": last["written_bytes"] / max(1, last["events"]),
        "written_bytes_per_s": last["written_bytes"] / last["t"],
        "disk_bytes_max": max(x["disk_bytes"] for x in looks),
        "disk_bytes_end": last["disk_bytes"],
        "cuts": len(cuts),
        "looks": looks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 minutes, cuts every 5,000")
    args = parser.parse_args()
    started = time.monotonic()
    minutes, every = (3.0, 5_000) if args.quick else (8.0, 20_000)
    with harness.job_home():
        r = run(minutes, every)
    mb = 1024 * 1024
    hour_baseline = r["written_bytes_per_s"] * 3600 / mb
    harness.log(
        f"{r['events']:,} events in {r['seconds']:.0f} s ({r['events_per_s']:.0f}/s, "
        f"{r['bytes_per_event']:.0f} bytes each), {r['cuts']} cuts; written "
        f"{r['written_bytes'] / mb:.1f} MB, on disk at most {r['disk_bytes_max'] / mb:.2f} MB"
    )
    rows = [
        harness.row(
            case="CTR 2 workers + 1 PS, the journal's disk per hour",
            metric="journal on disk after an hour",
            unit="MB",
            ours=[r["disk_bytes_max"] / mb],
            baseline=[hour_baseline],
            baseline_label="without compaction (the bytes written an hour)",
            higher_is_better=False,
            note=(
                f"{r['events_per_s']:.0f} events/s, {r['bytes_per_event']:.0f} bytes each, "
                f"measured over {r['seconds'] / 60:.0f} min; ours: the most on disk during "
                f"the run, compacted every {every:,} events ({r['cuts']} cuts), bounded "
                "from the first cut on"
            ),
        )
    ]
    harness.write_result(
        NAME,
        "A real CTR job's journal on disk: written an hour, and kept",
        rows,
        {"run": r, "journal_compact_every": every, "minutes": minutes},
        command=f".venv/bin/python bench/{NAME}.py" + (" --quick" if args.quick else ""),
        seconds=time.monotonic() - started,
    )


if __name__ == "__main__":
    main()
