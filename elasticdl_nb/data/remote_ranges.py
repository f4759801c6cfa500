"""A task's bytes from a remote object, found through the source's sparse index.

The worker-side counterpart of `sparse_index`: start at the last checkpoint at
or before the task, fetch about as many bytes as the units up to the task's end
should take (one ranged request, usually), fetch more only if that was short,
then cut out exactly the task's lines or records.
"""

from __future__ import annotations

from elasticdl_nb.data import csv_lines, tfrecord_framing
from elasticdl_nb.data.errors import DataError
from elasticdl_nb.data.remote_files import ObjectStore
from elasticdl_nb.data.sparse_index import SparseIndex


class RemoteSpans:
    """Ranged reads of one remote object, in units (lines or records) of its sparse index."""

    def __init__(self, url: str, index: SparseIndex) -> None:
        self.url = url
        self.index = index
        self._store = ObjectStore(url)
        self._checked = False

    def csv_lines(self, first: int, stop: int) -> tuple[bytes, int]:
        """(the bytes of non-empty lines [first, stop), the offset they start at)."""
        unit, offset = self.index.checkpoint(first)
        skip, wanted = first - unit, stop - first
        buffer, at_end = self._fetch(offset, skip + wanted, b"")
        while True:
            starts, ends = csv_lines.nonempty_lines_in(buffer, at_end)
            if len(starts) >= skip + wanted or at_end:
                break
            buffer, at_end = self._fetch(offset, skip + wanted, buffer)
        if len(starts) < skip + wanted:
            raise self._changed()
        begin, end = int(starts[skip]), int(ends[skip + wanted - 1])
        return buffer[begin:end], offset + begin

    def tfrecords(self, first: int, stop: int) -> list[bytes]:
        """The payloads of records [first, stop)."""
        unit, offset = self.index.checkpoint(first)
        skip, wanted = first - unit, stop - first
        buffer, at_end = self._fetch(offset, skip + wanted, b"")
        while True:
            ends = tfrecord_framing.record_ends(buffer, skip + wanted)
            if len(ends) >= skip + wanted or at_end:
                break
            buffer, at_end = self._fetch(offset, skip + wanted, buffer)
        if len(ends) < skip + wanted:
            raise self._changed()
        begin = ends[skip - 1] if skip else 0
        return tfrecord_framing.split_records(buffer[begin : ends[-1]], self.url)

    def _fetch(self, offset: int, units: int, buffer: bytes) -> tuple[bytes, bool]:
        """`buffer` (the bytes from `offset` on, fetched so far) extended by a guess of
        what `units` units take (doubling on every retry), and whether the object ends
        there."""
        if not self._checked:
            self._check_unchanged()
        start = offset + len(buffer)
        stop = min(self.index.size, start + max(self.index.bytes_for(units), len(buffer)))
        return buffer + self._store.read(self.url, start, stop), stop >= self.index.size

    def _check_unchanged(self) -> None:
        if self._store.stat(self.url) != (self.index.size, self.index.version):
            raise self._changed()
        self._checked = True

    def _changed(self) -> DataError:
        return DataError(
            f"Source {self.url!r} changed while the job was running: it no longer has "
            f"the size, version or records it had when the job resolved its inputs "
            f"({self.index.size} bytes, {self.index.units} lines or records). Fix: do "
            f"not overwrite input objects during a job; restart the job to re-count them."
        )
