"""The job's event journal: every fact the master learns, numbered from 0.

Widgets, the CLI and `Job.events()` all read this one stream; a reader that reconnects
asks for `from_seq` and gets everything from there, so replaying from 0 rebuilds the whole
picture. The journal is also appended to `events.jsonl` in the job directory, which is how
a finished job's history stays readable after the master has exited, and what a master
that replaces one that died rebuilds the job from (`recovery.py`): every event is on the
file before the master answers the call that caused it, and what one call changes is
written as one transaction (all of it, or none, is what a new master finds).
"""

from __future__ import annotations

import contextlib
import json
import logging
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
    file, so an event's number is its place in both; a follower waits on it for new
    events and never holds it while it yields. Events are never dropped or changed:
    memory grows with the job (a loss point is a few dozen bytes).

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
        self._changed = threading.Condition()
        self._closed = False
        self._path = path
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._inherited = len(self._events)
        self._transaction: list[Event] | None = None  # the open one's events, unwritten

    @property
    def continued(self) -> list[Event]:
        """The events an earlier master of this job wrote (empty for a new job)."""
        return self._events[: self._inherited]

    def append(self, kind: EventKind, /, **data: Any) -> Event:
        """Add an event of `kind` with `data` (JSON-able: the fields of the kind's payload,
        `vocabulary.events`)."""
        with self._changed:
            if self._fence is not None:
                self._fence()
            event = Event(len(self._events), time.time(), kind, data)
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

    def __len__(self) -> int:
        return len(self._events)

    def read(
        self, from_seq: int = 0, follow: bool = True, is_cancelled=lambda: False, poll: float = 0.5
    ) -> Iterator[Event]:
        """Events from `from_seq`; with `follow`, wait for new ones until the journal closes
        or `is_cancelled()` (checked every `poll` seconds) turns true."""
        seq = max(0, from_seq)
        while True:
            with self._changed:
                while seq >= len(self._events) and follow and not self._closed:
                    if is_cancelled():
                        return
                    self._changed.wait(poll)
                batch = self._events[seq:]
                done = not follow or self._closed
            yield from batch
            seq += len(batch)
            if done and seq >= len(self._events):
                return


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
    for i, event in enumerate(events):
        if event.seq != i:
            raise ValueError(f"{path}: event {i} is numbered {event.seq}: not one journal")
    return events


def read_journal_file(path: Path, from_seq: int = 0) -> Iterator[Event]:
    """Events of a journal file written by `Journal` (a finished job's history)."""
    if not path.exists():
        return
    with open(path) as lines:
        for line in lines:
            if line.strip():
                try:
                    event = Event.from_json(line)
                except json.JSONDecodeError:  # a last line cut short by a killed master
                    continue
                if event.seq >= from_seq:
                    yield event
