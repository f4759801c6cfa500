"""The job's event journal: every fact the master learns, numbered from 0.

Widgets, the CLI and `Job.events()` all read this one stream; a reader that reconnects
asks for `from_seq` and gets everything from there, so replaying from 0 rebuilds the whole
picture. The journal is also appended to `events.jsonl` in the job directory, which is how
a finished job's history stays readable after the master has exited, and what a master
that replaces one that died rebuilds the job from (`recovery.py`): every event is on the
file before the master answers the call that caused it, and what one call changes is
written as one transaction (all of it, or none, is what a new master finds).

A job that runs for days would write tens of millions of events: the master compacts
its journal (`compaction.py`). Once a snapshot of its state stands for the events before
a seq, those leave `events.jsonl` and memory, and what is kept of them (`vocabulary`'s
DROPPED_KINDS and THINNED_KINDS say what) goes to `events-history.jsonl`; numbering goes
on. A reader from a seq before the cut gets the history's events from there, then the
rest: every event that was kept, in order, with gaps where events were not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from elasticdl_nb.vocabulary.events import MORE, Event, EventKind

log = logging.getLogger("elasticdl_nb.master")


class Journal:
    """The job's events in order, numbered from 0: appended by the master, read by any
    number of followers (`StreamEvents`, in-process tests), and written line by line to
    `events.jsonl` when given a path.

    Threading: any thread may append and read. One condition guards the list and the
    files, so an event's number is its place in both; a follower waits on it for new
    events and never holds it while it yields. Events are never changed; the list (and
    `events.jsonl`) holds those since the newest compaction (`cut`), which moves what is
    kept of the ones before to the history file.

    What one call of the master changes may take several events (a report: the queue's
    record of it, the loss points, the task's end): `transaction()` makes them one write,
    seen by followers together, and all or none of them are what a new master rebuilds
    from.
    """

    def __init__(self, path: Path | None = None, fence: Callable[[], None] | None = None):
        """`fence`: called before an event is taken (`site.Fence.check`): a master that
        another has replaced must not add to the journal its successor continues."""
        self._fence = fence
        self._events: list[Event] = list(_continued(path)) if path else []
        self._first = self._events[0].seq if self._events else 0  # the seq of _events[0]
        self._changed = threading.Condition()
        self._closed = False
        self._path = path
        self._history = history_path(path) if path else None
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._inherited = len(self._events)
        self._transaction: list[Event] | None = None  # the open one's events, unwritten

    @property
    def continued(self) -> list[Event]:
        """The events an earlier master of this job wrote since the journal's newest
        compaction (empty for a new job)."""
        return self._events[: self._inherited]

    @property
    def first(self) -> int:
        """The seq of the oldest event in memory and in `events.jsonl`: those before it
        were compacted (0: never)."""
        return self._first

    def append(self, kind: EventKind, /, **data: Any) -> Event:
        """Add an event of `kind` with `data` (JSON-able: the fields of the kind's payload,
        `vocabulary.events`)."""
        with self._changed:
            if self._fence is not None:
                self._fence()
            event = Event(self._first + len(self._events), time.time(), kind, data)
            self._events.append(event)
            if self._transaction is not None:
                self._transaction.append(event)  # written when the transaction ends
            else:
                self._write([event])
            return event

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The events appended inside the block (by this thread: others wait, as do
        followers) are written in one go when it ends, the lines before the last marked
        `more`: a master killed while writing them leaves a tail that its successor cuts
        off (`_continued`), as if the call that made them had never come. Nests (the
        outermost one writes)."""
        with self._changed:
            if self._transaction is not None:
                yield
                return
            self._transaction = []
            try:
                yield
            finally:
                events, self._transaction = self._transaction, None
                if events:
                    if self._fence is not None:  # (the block may have outlived the right)
                        self._fence()
                    self._write(events)

    def _write(self, events: list[Event]) -> None:
        """Put events on the file, and tell followers (under the condition)."""
        last = len(events) - 1
        lines = "".join(event.to_json(more=i < last) + "\n" for i, event in enumerate(events))
        if self._file:
            self._file.write(lines)
        elif self._closed and self._path:  # a bug in the order of the master's end, but
            log.warning("events after the journal closed: %s", lines)
            with open(self._path, "a") as late:  # no event is ever off the file
                late.write(lines)
        self._changed.notify_all()

    def close(self) -> None:
        """No more events: followers drain what is left and stop."""
        with self._changed:
            self._closed = True
            if self._file:
                self._file.close()
                self._file = None
            self._changed.notify_all()

    def cut(self, before: int, history: list[Event], compacted: dict) -> None:
        """Compact: the events before `before` leave memory and `events.jsonl`, and
        `history` (what is kept of every event before `before`, old history included)
        becomes the history file; a `journal_compacted` event with `compacted` says so,
        the first of the new `events.jsonl`. Each file is replaced whole (written, then
        renamed over the old one): a master killed on the way leaves the old files, or
        the new history beside the old tail, whose events it still holds."""
        if self._path is None or self._history is None:
            raise ValueError("only a journal on a file is compacted")
        _write_whole(self._history, history)  # (outside the lock: it is what came before)
        with self._changed:
            if self._transaction is not None or before < self._first:
                raise ValueError(f"no cut at {before}: the journal is at {self._first}")
            if self._fence is not None:
                self._fence()
            tail = self._events[before - self._first :]
            event = Event(self._first + len(self._events), time.time(),
                          EventKind.JOURNAL_COMPACTED, compacted)  # fmt: skip
            if self._file is not None:
                self._file.close()
            _write_whole(self._path, [*tail, event])
            self._file = open(self._path, "a", buffering=1)  # noqa: SIM115
            self._inherited = max(0, self._inherited - (before - self._first))
            self._events, self._first = [*tail, event], before
            self._changed.notify_all()

    def __len__(self) -> int:
        """The seq the next event gets."""
        return self._first + len(self._events)

    def read(
        self, from_seq: int = 0, follow: bool = True, is_cancelled=lambda: False, poll: float = 0.5
    ) -> Iterator[Event]:
        """Events from `from_seq` (those compacted away: what the history kept of them);
        with `follow`, wait for new ones until the journal closes or `is_cancelled()`
        (checked every `poll` seconds) turns true."""
        seq = max(0, from_seq)
        while True:
            with self._changed:
                if seq < self._first:  # compacted: the history holds what was kept
                    history = _open_or_none(self._history)  # (as of this cut: renamed whole)
                    until = self._first
                else:
                    history = None
                    while seq >= len(self) and follow and not self._closed:
                        if is_cancelled():
                            return
                        self._changed.wait(poll)
                    batch = self._events[seq - self._first :]
                    done = not follow or self._closed
            if history is not None:
                with history:
                    yield from _events_of(history, seq, until)
                seq = until
                continue
            yield from batch
            seq += len(batch)
            if done and seq >= len(self):
                return


def history_path(path: Path) -> Path:
    """The history file of the journal file `path` (job_dir.JobDir.events_history)."""
    return path.with_name(f"{path.stem}-history{path.suffix}")


def _write_whole(path: Path, events: list[Event]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        out.writelines(event.to_json() + "\n" for event in events)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _open_or_none(path: Path | None):
    try:
        return open(path) if path else None  # noqa: SIM115 (the reader closes it)
    except FileNotFoundError:
        return None


def _events_of(lines, from_seq: int, until: int | None = None) -> Iterator[Event]:
    """The events of journal lines with from_seq <= seq < until; a last line cut short
    by a killed writer is skipped."""
    for line in lines:
        if not line.strip():
            continue
        try:
            event = Event.from_json(line)
        except json.JSONDecodeError:
            continue
        if until is not None and event.seq >= until:
            return
        if event.seq >= from_seq:
            yield event


def _continued(path: Path) -> list[Event]:
    """The events of a journal file an earlier master wrote, which this one continues.
    A line cut short by that master's death is cut off the file, and so is a transaction
    whose last line is missing, so the next event starts on a line of its own and
    numbering goes on without a gap."""
    if not path.exists():
        return []
    with open(path, "rb+") as f:
        raw = f.read()
        whole = raw.rfind(b"\n") + 1
        lines = raw[:whole].decode().splitlines(keepends=True)
        while lines and lines[-1].strip() and json.loads(lines[-1]).get(MORE):  # unfinished
            whole -= len(lines.pop().encode())
        if whole < len(raw):
            f.truncate(whole)
    events = [Event.from_json(line) for line in lines if line.strip()]
    first = events[0].seq if events else 0
    for i, event in enumerate(events):
        if event.seq != first + i:
            raise ValueError(
                f"{path}: event {i} is numbered {event.seq}, after {first}: not one journal"
            )
    return events


def read_journal_file(path: Path, from_seq: int = 0) -> Iterator[Event]:
    """Events of a journal file written by `Journal` (a finished job's history) from
    `from_seq`: what its history file kept of those it compacted, then the rest."""
    tail = _open_or_none(path)
    history = _open_or_none(history_path(path))  # (opened second: as new as the tail)
    if tail is None:
        if history is not None:
            history.close()
        return
    with tail:
        first = next((e.seq for e in _events_of(tail, 0)), 0)
        if history is not None:
            with history:
                yield from _events_of(history, from_seq, first)
        tail.seek(0)
        yield from _events_of(tail, from_seq)
