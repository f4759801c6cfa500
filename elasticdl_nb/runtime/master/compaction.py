"""Compacting a job's journal, so that a job that runs for days keeps a bounded journal
and a master that takes it over starts in constant time (issue 39).

Every `journal_compact_every` events (JobSpec; 20,000) the master takes a snapshot of
its state (`snapshot.py`), writes it to `master.snapshot` (whole, then renamed), and
cuts its journal there (`Journal.cut`): the events before the snapshot leave memory
and `events.jsonl`, and the history file keeps of them (the rule, `vocabulary.events`):

- none of DROPPED_KINDS (`queue`, `evaluation_task`): the snapshot holds what they built;
- of each of THINNED_KINDS (`loss`, `progress`, `worker_time`, ..., `master_saturated`),
  at most THIN_CAP: while there are more, the newer half stays whole and every other
  event of the older half goes, so the older a stretch of the job, the coarser its
  sample (the events since the newest cut are all there, in `events.jsonl`);
- every event of every other kind (job states, phases, epochs, evaluations, instances,
  scaling, relaunches, callbacks...): their number grows with the job's epochs and faults,
  not with its hours.

A new master restores the snapshot and replays the events after it (at most
`journal_compact_every` and the few written while it was taken: about half a second's
work for 20,000). Readers of the journal get the
history's events, then the rest (`Journal.read`, `read_journal_file`); the
`journal_compacted` event at each cut says what went.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from elasticdl_nb.runtime.master import snapshot
from elasticdl_nb.vocabulary.events import DROPPED_KINDS, THIN_CAP, THINNED_KINDS, Event

if TYPE_CHECKING:
    from elasticdl_nb.runtime.master.job_master import JobMaster

log = logging.getLogger("elasticdl_nb.master")


def kept(events: Iterable[Event], cap: int = THIN_CAP) -> tuple[list[Event], dict[str, int]]:
    """What the history keeps of `events` (in order, as the module docstring says), and
    how many of each thinned kind that is."""
    events = [e for e in events if e.kind not in DROPPED_KINDS]
    by_kind: dict[str, list[int]] = {}
    for i, event in enumerate(events):
        if event.kind in THINNED_KINDS:
            by_kind.setdefault(event.kind, []).append(i)
    gone: set[int] = set()
    for positions in by_kind.values():
        while len(positions) > cap:
            older = len(positions) // 2
            gone.update(positions[1:older:2])
            positions[:older] = positions[:older:2]
    history = [e for i, e in enumerate(events) if i not in gone]
    thinned = {kind: len(positions) for kind, positions in sorted(by_kind.items())}
    return history, thinned


def write_snapshot(path: Path, blob: bytes) -> None:
    """The snapshot file, whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(blob)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def compact(master: JobMaster, snapshot_path: Path, cap: int = THIN_CAP) -> dict:
    """Snapshot the master and cut its journal there; returns what the cut's
    `journal_compacted` event says."""
    started = time.monotonic()
    journal = master.journal
    seq, blob = snapshot.take(master)
    write_snapshot(snapshot_path, blob)  # (first: the cut may drop only what it holds)
    before = list(itertools.takewhile(lambda e: e.seq < seq, journal.read(0, follow=False)))
    history, thinned = kept(before, cap)
    compacted = {
        "before": seq,
        "kept": len(history),
        "dropped": seq - len(history),
        "thinned": thinned,
        "thin_cap": cap,
        "seconds": round(time.monotonic() - started, 3),
    }
    journal.cut(seq, history, compacted)
    log.info(
        "journal compacted before event %d: %d kept, snapshot %d bytes, %.2f s",
        seq,
        len(history),
        len(blob),
        compacted["seconds"],
    )
    return compacted


class Compactor:
    """Compacts the master's journal whenever `every` events have been written since its
    newest cut, on a thread of its own, until the job ends."""

    def __init__(self, master: JobMaster, snapshot_path: Path, every: int):
        self._master, self._path, self.every = master, snapshot_path, every
        self._thread = threading.Thread(target=self._run, name="compactor", daemon=True)

    def start(self) -> Compactor:
        self._thread.start()
        return self

    def _run(self) -> None:
        master, journal = self._master, self._master.journal
        due = journal.first + self.every
        while not master.finished.wait(1.0):
            if len(journal) < due:
                continue
            try:
                compact(master, self._path)
            except Exception:  # the job goes on with a longer journal; said in the log
                log.exception("the journal could not be compacted")
            due = max(journal.first, len(journal)) + self.every
