"""A job that runs for days (issue 39): its journal on disk, a master's takeover and a
client's first look after millions of events, with the journal compacted and without.

    .venv/bin/python bench/long_journal.py            # 10 M events (~20 min)
    .venv/bin/python bench/long_journal.py --quick    # 1 M events (~3 min)

The journal is written by a real `JobMaster`, built by the master process's own factory
(`assembly.build_master`) over a job directory, and driven in this process as fast as it
answers by simulated workers' calls, as a real PS job's workers make them: each asks for a
task (`get_task`), reports each of its 4 minibatches with its loss, the last report with
the task's timing (`report`); the next epoch starts when one is done, as the
coordinator starts it. So every event is one the master writes for a real job (queue
records, losses, timings, progress, epochs), in a real job's proportions, ~10 per task;
no gRPC, no TensorFlow, no PS process (nothing here depends on them). A dataset of 64,000
records per epoch (500 tasks), 8 workers.

ours      journal_compact_every=20,000 (the default): the master compacts as it goes
          (`compaction.compact`, called where its Compactor thread would).
baseline  journal_compact_every=0: every event kept, which every job did before issue 39.

After N events, in a fresh process each (TensorFlow never imported): a new master takes
the job over (`recovery.take_over`: open the journal, restore the snapshot, replay what
follows it; the time until it could serve), and a client folds the journal as `attach`,
the dashboard and the sidebar do (`read_journal_file` into a `JobView`). The baseline
runs to N/10 events (its journal in memory grows with every event) and its figures at N
are a line through its 10,000-event and N/10 ones, extrapolated (said in the row).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORDS = 64_000  # per epoch: 2,000 minibatches of 32, 500 tasks of 4
WORKERS = 8
SMALL = 10_000  # the short job each takeover is compared with


def _master(job_dir: Path, compact_every: int, journal):
    """The job's master as the master process builds it (the same for the generator and
    for the one that takes over)."""
    from elasticdl_nb.data import SourceInfo
    from elasticdl_nb.runtime.job_dir import JobDir
    from elasticdl_nb.runtime.master.assembly import build_master
    from elasticdl_nb.runtime.master.callbacks import CALLBACKS_FILE
    from elasticdl_nb.spec import JobSpec

    spec = JobSpec.from_options(
        data=["x"],
        workers=WORKERS,
        ps=1,
        epochs=10**6,
        minibatch_size=32,
        minibatches_per_task=4,
        journal_compact_every=compact_every,
        tensorboard=False,
    )
    bundle = JobDir(job_dir).bundle
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / CALLBACKS_FILE).write_text("[]")

    class NoProcesses:  # (the workers are this process's calls; the PS is not needed)
        def launch(self, role, instance_id, elastic=False):
            pass

        def kill(self, role, instance_id, force=False):
            pass

        def shutdown(self, grace_seconds):
            pass

        def adopt(self):
            return set()

    return build_master(
        spec,
        job_dir,
        journal,
        token="t",
        train=[SourceInfo("train", "npy", RECORDS)],
        validation=[],
        launcher_for=lambda on_event: NoProcesses(),
    )


def generate(job_dir: Path, events: int, compact_every: int) -> dict:
    """Drive a master until its journal has `events` events; returns what it took."""
    from elasticdl_nb.runtime.job_dir import JobDir
    from elasticdl_nb.runtime.master import compaction
    from elasticdl_nb.runtime.master.journal import Journal
    from elasticdl_nb.runtime.master.site import InstanceEvent
    from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
    from elasticdl_nb.vocabulary import InstanceState, Role

    files = JobDir(job_dir)
    journal = Journal(files.events)
    master = _master(job_dir, compact_every, journal)
    master.start_instances()
    for worker in range(WORKERS):
        master.instances.on_event(InstanceEvent(Role.WORKER, worker, InstanceState.STARTED))
    master.instances.on_event(InstanceEvent(Role.PS, 0, InstanceState.STARTED))
    master.strategy.ps_ready(0, -1, "127.0.0.1:1", incarnation=1)
    seqs = dict.fromkeys(range(WORKERS), 0)
    epoch, cuts, started = -1, [], time.monotonic()
    while len(journal) < events:
        if not master.queue.todo and not master.queue.doing:
            epoch += 1
            with master.lock:
                master.start_epoch(epoch)
        for worker in range(WORKERS):
            seqs[worker] += 1
            task = master.get_task(worker, seq=seqs[worker], wait_seconds=0)
            if task.type != pb.TRAINING:
                continue
            starts = list(range(task.range.start, task.range.end, 32))
            for i, start in enumerate(starts):
                seqs[worker] += 1
                report = pb.ProgressReport(
                    worker_id=worker, task_id=task.task_id, seq=seqs[worker],
                    task_done=i == len(starts) - 1,
                )  # fmt: skip
                report.batch_starts.append(start)
                report.losses.add(loss=1.0 / (1 + epoch), learning_rate=0.01)
                if report.task_done:
                    report.timing.minibatches = len(starts)
                    report.timing.task_seconds, report.timing.compute_seconds = 0.4, 0.3
                    report.timing.wait_seconds = 0.05
                master.report(report)
        if compact_every and len(journal) - journal.first >= compact_every:
            cuts.append(compaction.compact(master, files.master_snapshot)["seconds"])
    seconds = time.monotonic() - started
    journal.close()
    return {
        "events": len(journal),
        "epochs": epoch + 1,
        "seconds": round(seconds, 1),
        "events_per_s": round(len(journal) / seconds),
        "compactions": len(cuts),
        "compaction_s": harness.stats(cuts) if cuts else None,
        "disk_bytes": sum(
            p.stat().st_size
            for p in (files.events, files.events_history, files.master_snapshot)
            if p.exists()
        ),  # fmt: skip
        "snapshot_bytes": files.master_snapshot.stat().st_size
        if files.master_snapshot.exists()
        else 0,
    }


def measure_takeover(job_dir: Path, compact_every: int) -> dict:
    """In this (fresh) process: a new master takes the job over; then a client folds the
    journal. Seconds of each."""
    from elasticdl_nb.runtime.job_dir import JobDir
    from elasticdl_nb.runtime.master.journal import Journal, read_journal_file
    from elasticdl_nb.runtime.master.recovery import take_over
    from elasticdl_nb.sdk.view import JobView

    files = JobDir(job_dir)
    began = time.monotonic()
    journal = Journal(files.events)
    master = _master(job_dir, compact_every, journal)
    take_over(master, files, journal)
    takeover = time.monotonic() - began
    journal.close()
    began = time.monotonic()
    view = JobView(job_dir.name, epochs=10**6, workers=WORKERS, ps=1)
    read = 0
    for event in read_journal_file(files.events):
        view.apply(event)
        read += 1
    fold = time.monotonic() - began
    return {
        "takeover_s": round(takeover, 3),
        "replayed": master.rebuilt["replayed"],
        "snapshot": master.rebuilt["snapshot"],
        "client_fold_s": round(fold, 3),
        "client_events": read,
        "rss_mb": round(_rss_mb(), 1),
    }


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _measure(events: int, compact_every: int) -> dict:
    """Generate a journal of `events` events, then take it over in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="edl-long-journal-") as tmp:
        job_dir = Path(tmp) / "long-job"
        job_dir.mkdir()
        made = generate(job_dir, events, compact_every)
        done = subprocess.run(
            [sys.executable, __file__, "--take-over", str(job_dir), str(compact_every)],
            capture_output=True, text=True, check=True, timeout=3600,
        )  # fmt: skip
        result = {**made, **json.loads(done.stdout.strip().splitlines()[-1])}
    harness.log(f"{events:,} events, compact every {compact_every}: {result}")
    return result


def _extrapolated(small: dict, large: dict, events: int, key: str) -> float:
    """`key` at `events`, on the line through its figures at `small` and `large`."""
    slope = (large[key] - small[key]) / (large["events"] - small["events"])
    return small[key] + slope * (events - small["events"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--take-over", nargs=2, metavar=("JOB_DIR", "COMPACT_EVERY"))
    args = parser.parse_args()
    if args.take_over:
        print(json.dumps(measure_takeover(Path(args.take_over[0]), int(args.take_over[1]))))
        return
    began = time.monotonic()
    n = 1_000_000 if args.quick else 10_000_000
    ours_small = _measure(SMALL, 20_000)
    ours = _measure(n, 20_000)
    base_small = _measure(SMALL, 0)
    base = _measure(n // 10, 0)
    base_at_n = {k: _extrapolated(base_small, base, n, k) for k in
                 ("takeover_s", "client_fold_s", "disk_bytes")}  # fmt: skip
    label = f"{n // 1_000_000} M events"
    note = f"baseline: without compaction, extrapolated from {SMALL:,} and {n // 10:,} events"
    rows = [
        harness.row(
            f"takeover after {label}, compacted", "seconds", [ours["takeover_s"]],
            [ours_small["takeover_s"]], baseline_label=f"after {SMALL:,} events",
            higher_is_better=False, limit=2.0, unit="s",
        ),
        harness.row(
            f"takeover after {label}", "seconds", [ours["takeover_s"]],
            [base_at_n["takeover_s"]], baseline_label="not compacted", higher_is_better=False,
            unit="s", note=note,
        ),
        harness.row(
            f"client fold (attach, dashboard) after {label}", "seconds",
            [ours["client_fold_s"]], [base_at_n["client_fold_s"]],
            baseline_label="not compacted", higher_is_better=False, limit=3.0, unit="s",
            note=note,
        ),
        harness.row(
            f"journal on disk after {label}", "MB", [ours["disk_bytes"] / 1e6],
            [base_at_n["disk_bytes"] / 1e6], baseline_label="not compacted",
            higher_is_better=False, unit="MB", note=note,
        ),
    ]  # fmt: skip
    harness.write_result(
        "long_journal",
        "A job of millions of journal events: takeover, client, disk (issue 39)",
        rows,
        {"ours_small": ours_small, "ours": ours, "baseline_small": base_small, "baseline": base},
        command=".venv/bin/python bench/long_journal.py" + (" --quick" if args.quick else ""),
        seconds=round(time.monotonic() - began),
    )


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
