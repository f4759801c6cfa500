"""A stand-in master for the TensorBoard log's tests: it continues the journal in a job
directory (as a master that took over does), writes the TensorBoard log from it, and
journals `count` loss events of 10 points each, numbered on from the journal's last
point, a few milliseconds apart, then ends cleanly and prints whether TensorFlow got
imported (with the master's own modules and the log written, it must not: a master
restarts in half a second without it). Killed midway, it leaves what a master that died
leaves.

    python -m tests.unit.tensorboard_master JOB_DIR COUNT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import elasticdl_nb.runtime.master.serve  # noqa: F401 (the master process's modules)
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.tensorboard_log import TensorBoardLog
from elasticdl_nb.vocabulary import EventKind


def main(job_dir: Path, count: int) -> None:
    files = JobDir(job_dir)
    journal = Journal(files.events)
    log = TensorBoardLog(journal, files.tensorboard, flush_seconds=0.003).start()
    points = [p for e in journal.continued if e.kind == EventKind.LOSS for p in e.data["points"]]
    n = points[-1][0] + 1 if points else 0
    for _ in range(count):
        journal.append(
            EventKind.LOSS, worker=0, points=[[n + i, 1.0 / (n + i + 1)] for i in range(10)]
        )
        n += 10
        time.sleep(0.002)
    journal.close()
    log.close()
    print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "seq": log.seq}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
