"""The job's TensorBoard log: a thread of the master that follows the event journal and
appends the scalars it implies (`summaries.py`) to one event file in the job directory's
`tensorboard/` folder, for `tensorboard --logdir` (JobSpec `tensorboard`).

Records are framed by TensorBoard's own `RecordWriter` (the format its readers check)
around its `Event` protos; neither imports TensorFlow, and nothing here touches
`tensorboard.compat.tf`, which would (the master must start without it).

Exactly once across a master's death: after each batch of records is flushed, the
position is saved beside the file (`.written.json`: the journal seq written up to and
the file's length then). A master that took over truncates the file to that length
(cutting off whatever the one that died wrote after it, a half record included), folds
the journal up to that seq without writing, and goes on from there.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import BinaryIO

from elasticdl_nb.runtime.job_dir import read_json, write_json
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.summaries import Scalar, Summaries

log = logging.getLogger("elasticdl_nb.master")

POSITION = ".written.json"  # {"file", "bytes", "seq"}: what the file holds
SUFFIX = ".elasticdl-nb"  # of the event file's name (TensorBoard reads any *tfevents*)


class TensorBoardLog:
    """Writes the TensorBoard scalars of `journal` under `logdir`, on its own thread
    (`start`), every `flush_seconds`, until `close` (after the journal closed)."""

    def __init__(self, journal: Journal, logdir: Path, flush_seconds: float = 1.0):
        self.journal, self.logdir, self.flush_seconds = journal, logdir, flush_seconds
        self.summaries = Summaries()
        self.seq = 0  # the next journal event to write
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)
        self._file: BinaryIO | None = None
        self._writer = None  # tensorboard's RecordWriter over `_file`
        self._name = ""

    def start(self) -> TensorBoardLog:
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Write what is left of the journal and stop."""
        self._closing.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._open()
            while True:
                closing = self._closing.is_set()  # (read before the last catch-up)
                self.catch_up()
                if closing:
                    break
                self._closing.wait(self.flush_seconds)
        except Exception:  # the log is a view: the job goes on without it
            log.exception("the TensorBoard log in %s stopped", self.logdir)
        finally:
            if self._file is not None:
                self._file.close()

    def _open(self) -> None:
        """Open the event file where the position says, or a new one."""
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.logdir.mkdir(parents=True, exist_ok=True)
        position = read_json(self.logdir / POSITION) or {}
        path = self.logdir / position.get("file", "-")
        if (
            position
            and path.is_file()
            and path.stat().st_size >= position["bytes"]
            and position["seq"] <= len(self.journal)
        ):
            self._name, self.seq = path.name, position["seq"]
            with open(path, "rb+") as f:
                f.truncate(position["bytes"])
            for event in self.journal.read(0, follow=False):  # what it holds: folded again
                if event.seq >= self.seq:
                    break
                self.summaries.scalars(event)
            log.info("TensorBoard log %s goes on from event %d", path, self.seq)
            self._file = open(path, "ab")  # noqa: SIM115 (closed when the thread ends)
            self._writer = RecordWriter(self._file)
            return
        for stale in self.logdir.glob(f"*{SUFFIX}"):  # (a position lost: start over)
            stale.unlink()
        self._name = f"events.out.tfevents.{int(time.time()):010d}{SUFFIX}"
        self._file = open(self.logdir / self._name, "wb")  # noqa: SIM115
        self._writer = RecordWriter(self._file)
        first = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._writer.write(first.SerializeToString())
        self._saved()

    def catch_up(self) -> int:
        """Write the scalars of the journal events not written yet; returns how many
        events were read."""
        read = 0
        for event in self.journal.read(self.seq, follow=False):
            for record in _records(self.summaries.scalars(event)):
                self._writer.write(record)
            self.seq = event.seq + 1
            read += 1
        if read:
            self._saved()
        return read

    def _saved(self) -> None:
        """Flush the file, then say what it holds (a crash in between: the records past
        the saved length are cut and written again by the next master)."""
        self._writer.flush()
        write_json(
            self.logdir / POSITION,
            {"file": self._name, "bytes": self._file.tell(), "seq": self.seq},
        )


def _records(scalars: list[Scalar]) -> list[bytes]:
    """One serialized `Event` per step, holding that step's scalars."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    by_step: dict[int, list[Scalar]] = {}
    for s in scalars:
        by_step.setdefault(s.step, []).append(s)
    return [
        event_pb2.Event(
            wall_time=same[0].time,
            step=step,
            summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=s.tag, simple_value=s.value) for s in same]
            ),
        ).SerializeToString()
        for step, same in by_step.items()
    ]
