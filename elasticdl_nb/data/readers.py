"""Worker-side readers returning the records [start, end) of one source.

A task names a source and a record range; `open_reader` gives a reader for the
source and `read(start, end)` returns that range as NumPy structures ready for
`tf.data.Dataset.from_tensor_slices`. Readers build their index of record
offsets once and keep it, because a worker reads many tasks of the same file;
a remote source comes with a sparse index instead (see `sparse_index`), and a
task fetches only its own bytes through `remote_ranges`. This module does not
import TensorFlow so it stays importable on the master.
"""

import csv
import operator
import os
from abc import ABC, abstractmethod

import numpy as np

from elasticdl_nb.data import csv_lines, npy_layout, tfrecord_framing
from elasticdl_nb.data.csv_decoding import default_decode_csv
from elasticdl_nb.data.errors import DataError
from elasticdl_nb.data.remote_ranges import RemoteSpans
from elasticdl_nb.data.sources import CSV, NPY, TFRECORD, SourceInfo

__all__ = [
    "CsvReader",
    "NpyReader",
    "RecordReader",
    "Records",
    "TFRecordReader",
    "default_decode_csv",
    "open_reader",
]

Records = np.ndarray | dict[str, np.ndarray] | tuple[np.ndarray | dict[str, np.ndarray], np.ndarray]


class RecordReader(ABC):
    """Reads contiguous record ranges of one source."""

    def __init__(self, source: SourceInfo) -> None:
        self.source = source
        self._remote = RemoteSpans(source.uri, source.index) if source.index else None

    @abstractmethod
    def read(self, start: int, end: int) -> Records:
        """Records [start, end) in file order; empty (same structure) if start >= end."""

    def _checked_range(self, start: int, end: int) -> tuple[int, int]:
        start, end = operator.index(start), operator.index(end)
        if start < 0 or end > self.source.num_records:
            raise DataError(
                f"Record range [{start}, {end}) is outside source {self.source.uri!r}, "
                f"which has {self.source.num_records} records (valid: 0 <= start, "
                f"end <= {self.source.num_records}). Fix: build tasks from the "
                f"num_records that resolve_sources reported for this source."
            )
        return start, max(start, end)

    def _check_unchanged(self, found: int) -> None:
        """Fail if the source no longer has the record count the master saw.

        If the file changed since it was counted, task ranges no longer mean the
        same records, so refuse to read rather than return the wrong ones.
        `found` < 0 means the count is unknown but known to differ.
        """
        if found != self.source.num_records:
            now = f"now has {found} records" if found >= 0 else "has been modified"
            raise DataError(
                f"Source {self.source.uri!r} {now} but had "
                f"{self.source.num_records} records when the job resolved its inputs; "
                f"it changed while the job was running. Fix: do not modify input "
                f"files during a job; restart the job to re-count them."
            )


class CsvReader(RecordReader):
    """Rows of a CSV file as a 2-D object array of str, header excluded."""

    def __init__(
        self, source: SourceInfo, csv_header: bool = True, csv_delimiter: str = ","
    ) -> None:
        super().__init__(source)
        self._header = csv_header
        self._delimiter = csv_delimiter
        self._line_starts: np.ndarray | None = None
        self.column_names: list[str] = self._read_column_names()

    def read(self, start: int, end: int) -> np.ndarray:
        start, end = self._checked_range(start, end)
        count = end - start
        if count == 0:
            return np.empty((0, len(self.column_names)), dtype=object)
        raw, offset = self._span(start + self._header, end + self._header)
        lines = [line for line in _split_lines(self._decode(raw, offset)) if line]
        rows = list(csv.reader(lines, delimiter=self._delimiter))
        if len(rows) != count:
            raise DataError(
                f"CSV file {self.source.uri!r} has a quoted field containing a line "
                f"break between records {start} and {end}; records must be one line "
                f"each so tasks can seek to them. Fix: remove line breaks inside "
                f"fields, or convert the data to TFRecord."
            )
        self._check_widths(rows, start)
        table = np.empty((count, len(self.column_names)), dtype=object)
        table[:] = rows
        return table

    def _span(self, first_line: int, stop_line: int) -> tuple[bytes, int]:
        """(the bytes of non-empty lines [first_line, stop_line), their offset)."""
        if self._remote is not None:
            return self._remote.csv_lines(first_line, stop_line)
        line_starts = self._index()
        offset = int(line_starts[first_line])
        with open(self.source.uri, "rb") as file:
            file.seek(offset)
            if stop_line < len(line_starts):
                return file.read(int(line_starts[stop_line]) - offset), offset
            return file.read(), offset

    def _index(self) -> np.ndarray:
        if self._line_starts is None:
            line_starts = csv_lines.nonempty_line_starts(self.source.uri)
            self._check_unchanged(max(len(line_starts) - self._header, 0))
            self._line_starts = line_starts
        return self._line_starts

    def _read_column_names(self) -> list[str]:
        if self._remote is not None:
            raw, offset = self._remote.csv_lines(0, 1)
            line = next(_split_lines(self._decode(raw, offset)))
            return self._column_names(line)
        offset = 0
        with open(self.source.uri, "rb") as file:
            for raw in file:
                # Mirrors csv_lines: a line is empty if only its terminator remains.
                line = next(_split_lines(self._decode(raw, offset)))
                if line:
                    break
                offset += len(raw)
            else:
                return []
        return self._column_names(line)

    def _column_names(self, line: str) -> list[str]:
        fields = next(csv.reader([line], delimiter=self._delimiter))
        if self._header:
            return [field.strip() for field in fields]
        return [f"c{i}" for i in range(len(fields))]

    def _decode(self, raw: bytes, offset: int) -> str:
        try:
            # Only a file's very first bytes can carry a UTF-8 byte-order mark.
            return raw.decode("utf-8-sig" if offset == 0 else "utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"CSV file {self.source.uri!r} is not valid UTF-8 near byte "
                f"{offset + error.start}. Fix: re-encode the file as UTF-8."
            ) from error

    def _check_widths(self, rows: list[list[str]], start: int) -> None:
        width = len(self.column_names)
        for position, row in enumerate(rows):
            if len(row) != width:
                raise DataError(
                    f"CSV file {self.source.uri!r}: record {start + position} has "
                    f"{len(row)} fields but the file has {width} columns "
                    f"({', '.join(self.column_names)}). Fix: make every row have "
                    f"the same number of fields (check csv_delimiter="
                    f"{self._delimiter!r} and quoting)."
                )


class TFRecordReader(RecordReader):
    """Serialized records of a TFRecord file as a 1-D object array of bytes."""

    def __init__(self, source: SourceInfo) -> None:
        super().__init__(source)
        self._offsets: np.ndarray | None = None
        self._data_end = 0

    def read(self, start: int, end: int) -> np.ndarray:
        start, end = self._checked_range(start, end)
        records = np.empty(end - start, dtype=object)
        if end == start:
            return records
        if self._remote is not None:
            records[:] = self._remote.tfrecords(start, end)
            return records
        offsets = self._index()
        first = int(offsets[start])
        stop = int(offsets[end]) if end < len(offsets) else self._data_end
        with open(self.source.uri, "rb") as file:
            file.seek(first)
            buffer = file.read(stop - first)
        payloads = tfrecord_framing.split_records(buffer, self.source.uri)
        if len(payloads) != end - start:
            # The indexed offsets no longer bound end - start records.
            self._check_unchanged(-1)
        records[:] = payloads
        return records

    def _index(self) -> np.ndarray:
        if self._offsets is None:
            offsets = tfrecord_framing.record_offsets(self.source.uri)
            self._check_unchanged(len(offsets))
            self._data_end = os.path.getsize(self.source.uri)
            self._offsets = offsets
        return self._offsets


class NpyReader(RecordReader):
    """Slices of a staged-array directory: (x, y), or x alone when there is no y.npy."""

    def __init__(self, source: SourceInfo) -> None:
        super().__init__(source)
        self._arrays: tuple[npy_layout.StagedFeatures, np.ndarray | None] | None = None

    def read(self, start: int, end: int) -> Records:
        start, end = self._checked_range(start, end)
        features, labels = self._load()
        # np.array copies: the result must not keep the memory map alive or
        # change if the files are re-staged later.
        if isinstance(features, dict):
            x = {key: np.array(array[start:end]) for key, array in features.items()}
        else:
            x = np.array(features[start:end])
        if labels is None:
            return x
        return x, np.array(labels[start:end])

    def _load(self) -> tuple[npy_layout.StagedFeatures, np.ndarray | None]:
        if self._arrays is None:
            features, labels = npy_layout.load_staged_arrays(self.source.uri)
            self._check_unchanged(npy_layout.record_count(features))
            self._arrays = (features, labels)
        return self._arrays


def open_reader(
    source: SourceInfo, csv_header: bool = True, csv_delimiter: str = ","
) -> RecordReader:
    """A reader for `source`; the csv options must match those given to resolve_sources."""
    if source.format == CSV:
        return CsvReader(source, csv_header=csv_header, csv_delimiter=csv_delimiter)
    if source.format == TFRECORD:
        return TFRecordReader(source)
    if source.format == NPY:
        return NpyReader(source)
    raise DataError(f"No reader for format {source.format!r} of source {source.uri!r}.")


def _split_lines(text: str):
    """Lines split on "\\n" only (as csv_lines indexes them), minus one trailing "\\r"."""
    for line in text.split("\n"):
        yield line[:-1] if line.endswith("\r") else line
