"""A journal whose events carry the time the test says: folds of the journal (goodput,
stragglers) judge by the events' times."""

from __future__ import annotations

from elasticdl_nb.runtime.master.journal import Event, Journal

T0 = 1_700_000_000.0


class TimedJournal(Journal):
    """A journal whose events are stamped with `now` (set by the test), not the clock."""

    def __init__(self, path=None):
        super().__init__(path)
        self.now = T0

    def append(self, kind: str, /, **data) -> Event:
        with self._changed:
            event = Event(len(self._events), self.now, kind, data)
            self._events.append(event)
            if self._file:
                self._file.write(event.to_json() + "\n")
            return event

    def at(self, when: float, kind: str, /, **data) -> Event:
        """An event `when` seconds after T0."""
        self.now = T0 + when
        return self.append(kind, **data)
