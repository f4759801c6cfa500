"""Turns the user's `data` argument into a list of sources with their record counts.

Runs on the master, which cuts every source into (source, start, end) tasks, so
it must not import TensorFlow and must count records quickly: CSV lines are
counted with NumPy, TFRecord framing is walked by seeking, and staged `.npy`
arrays are memory-mapped to read their shapes. Remote URLs (s3://... and other
fsspec protocols) are read once here to count them and to build the sparse
index that lets workers fetch only their tasks' bytes.
"""

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticdl_nb.data import csv_lines, npy_layout, sparse_index, tfrecord_framing
from elasticdl_nb.data.errors import DataError
from elasticdl_nb.data.remote_files import ObjectStore, is_remote
from elasticdl_nb.data.sparse_index import SparseIndex

CSV = "csv"
TFRECORD = "tfrecord"
NPY = "npy"
FORMATS = (CSV, TFRECORD, NPY)  # what files resolve_sources reads
# A shard of a model's own `custom_data_reader` (model/custom_data_reader.py): its
# reader counts and reads it, not this package.
CUSTOM = "custom"
AUTO = "auto"

_FORMAT_BY_EXTENSION = {
    ".csv": CSV,
    ".txt": CSV,
    ".tfrecord": TFRECORD,
    ".tfrecords": TFRECORD,
    ".rec": TFRECORD,
}
_GLOB_CHARACTERS = frozenset("*?[")


@dataclass(frozen=True)
class SourceInfo:
    """One input source: where it is, how it is encoded, and how many records it holds."""

    uri: str  # (a custom reader's shard: the shard's name)
    format: str  # "csv" | "tfrecord" | "npy" | "custom"
    num_records: int
    index: SparseIndex | None = None  # remote sources only: where every k-th record starts
    origin: str = ""  # custom shards: the data origin their reader was made for
    offset: int = 0  # custom shards: the reader's number of the shard's first record

    def __post_init__(self) -> None:
        if self.format not in (*FORMATS, CUSTOM):
            raise DataError(
                f"Source {self.uri!r} has unknown format {self.format!r}. Fix: use "
                f"one of {', '.join(map(repr, FORMATS))}."
            )
        if self.num_records < 0:
            raise DataError(
                f"Source {self.uri!r} has a negative record count ({self.num_records}). "
                f"Fix: build SourceInfo with resolve_sources instead of by hand."
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, e.g. to ship the source list from master to workers."""
        fields: dict[str, Any] = {
            "uri": self.uri,
            "format": self.format,
            "num_records": self.num_records,
        }
        if self.index is not None:
            fields["index"] = self.index.to_dict()
        if self.format == CUSTOM:
            fields.update(origin=self.origin, offset=self.offset)
        return fields

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> "SourceInfo":
        """Inverse of `to_dict`."""
        return cls(
            uri=str(fields["uri"]),
            format=str(fields["format"]),
            num_records=int(fields["num_records"]),
            index=SparseIndex.from_dict(fields["index"]) if fields.get("index") else None,
            origin=str(fields.get("origin", "")),
            offset=int(fields.get("offset", 0)),
        )


def resolve_sources(
    data: str | list[str],
    data_format: str = AUTO,
    csv_header: bool = True,
    csv_delimiter: str = ",",
) -> list[SourceInfo]:
    """Expand paths/globs into sources, detect each one's format and count its records.

    `data` is a path, a glob or a list of them; glob matches are sorted, the
    given order is kept and duplicates are dropped. URIs are made absolute so
    workers with another working directory read the same files. A remote URL
    (s3://bucket/part-*.csv, any fsspec protocol) is globbed and read through
    fsspec, with credentials from the environment. Raises DataError when a path
    matches nothing, a format cannot be determined, a source is empty or a file
    is malformed, and for a missing bucket or refused credentials.
    """
    if data_format != AUTO and data_format not in FORMATS:
        raise DataError(
            f"data_format={data_format!r} is not supported. Fix: pass one of "
            f"{', '.join(map(repr, (AUTO, *FORMATS)))}."
        )
    if not isinstance(csv_delimiter, str) or len(csv_delimiter) != 1:
        raise DataError(
            f"csv_delimiter={csv_delimiter!r} must be a single character. Fix: pass "
            f"e.g. ',' or '\\t'."
        )
    stores: dict[str, ObjectStore] = {}  # one per protocol for this call
    paths = _expand(_as_patterns(data), stores)
    checkpoints = sparse_index.checkpoints_per_source(sum(map(is_remote, paths)))
    sources = []
    for path in paths:
        source_format = _detect_format(path) if data_format == AUTO else data_format
        _check_kind(path, source_format)
        if is_remote(path):
            store = _store(stores, path)
            sources.append(_remote_source(store, path, source_format, csv_header, checkpoints))
            continue
        num_records = _count(path, source_format, csv_header)
        if num_records == 0:
            raise _empty(path, source_format, csv_header, os.path.getsize(path))
        sources.append(SourceInfo(uri=path, format=source_format, num_records=num_records))
    return sources


def _store(stores: dict[str, ObjectStore], url: str) -> ObjectStore:
    protocol = url.partition("://")[0].lower()
    if protocol not in stores:
        stores[protocol] = ObjectStore(url)
    return stores[protocol]


def _remote_source(
    store: ObjectStore, url: str, source_format: str, csv_header: bool, checkpoints: int
) -> SourceInfo:
    if source_format == CSV:
        index = sparse_index.index_csv(store, url, checkpoints)
        num_records = max(index.units - 1, 0) if csv_header else index.units
    else:
        index = sparse_index.index_tfrecord(store, url, checkpoints)
        num_records = index.units
    if num_records == 0:
        raise _empty(url, source_format, csv_header, index.size)
    return SourceInfo(uri=url, format=source_format, num_records=num_records, index=index)


def _as_patterns(data: str | list[str]) -> list[str]:
    patterns = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not patterns:
        raise DataError(
            "No input data given: `data` is an empty list. Fix: pass a path, a glob "
            "such as '/data/part-*.csv', or a list of them."
        )
    return [os.fspath(pattern) for pattern in patterns]


def _expand(patterns: list[str], stores: dict[str, ObjectStore]) -> list[str]:
    paths: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if is_remote(pattern):
            found = _store(stores, pattern).expand(pattern)
        else:
            found = [os.path.abspath(path) for path in _matches(pattern)]
        for absolute in found:
            if absolute not in seen:
                seen.add(absolute)
                paths.append(absolute)
    return paths


def _matches(pattern: str) -> list[str]:
    if pattern.startswith(("file://", "local://")):
        pattern = pattern.partition("://")[2]
    expanded = os.path.expanduser(pattern)
    is_glob = any(character in _GLOB_CHARACTERS for character in expanded)
    if is_glob:
        matches = sorted(glob.glob(expanded, recursive=True))
    else:
        matches = [expanded] if os.path.exists(expanded) else []
    if not matches:
        what = "no file matches this glob" if is_glob else "this path does not exist"
        raise DataError(
            f"No input data found for {pattern!r}: {what}. Paths are resolved on the "
            f"machine running the job, relative ones against its current working "
            f"directory ({os.getcwd()}), not where you launched it from. Fix: check "
            f"the spelling, or pass an absolute path that exists on that machine."
        )
    return matches


def _detect_format(path: str) -> str:
    if not is_remote(path) and os.path.isdir(path):
        if npy_layout.looks_like_staged_dir(path):
            return NPY
        raise DataError(
            f"Input {path!r} is a directory but not a staged-array directory (it has "
            f"no x.npy or x.<key>.npy). Fix: to read the files inside it pass a glob "
            f"such as '{os.path.join(path, '*.csv')}', or create a staged directory "
            f"with stage_arrays(x, y, directory)."
        )
    extension = os.path.splitext(path)[1].lower()
    source_format = _FORMAT_BY_EXTENSION.get(extension)
    if source_format is None:
        known = ", ".join(f"{ext} -> {fmt}" for ext, fmt in _FORMAT_BY_EXTENSION.items())
        raise DataError(
            f"Cannot tell the format of {path!r} from its extension "
            f"({extension or 'none'}). Known extensions: {known}; a directory with "
            f"x.npy is npy. Fix: rename the file, narrow the glob to exclude it, or "
            f"pass data_format= one of {', '.join(map(repr, FORMATS))} "
            f"(default {AUTO!r} guesses from the extension)."
        )
    return source_format


def _check_kind(path: str, source_format: str) -> None:
    if is_remote(path):
        if source_format == NPY:
            raise DataError(
                f"Input {path!r} is remote, but data_format='npy' (staged arrays) is "
                f"read by memory-mapping a local directory. Fix: pass CSV or TFRecord "
                f"objects, or stage the arrays on a path the job's machines share."
            )
        return  # the store listed it as a file (ObjectStore.expand skips prefixes)
    is_dir = os.path.isdir(path)
    if source_format == NPY and not is_dir:
        raise DataError(
            f"Input {path!r} is a file, but data_format='npy' expects a staged-array "
            f"directory (holding x.npy or x.<key>.npy and optionally y.npy). Fix: "
            f"pass that directory, or create one with stage_arrays(x, y, directory)."
        )
    if source_format != NPY and is_dir:
        raise DataError(
            f"Input {path!r} is a directory, but data_format={source_format!r} expects "
            f"files. Fix: pass a glob for the files inside it, such as "
            f"'{os.path.join(path, '*')}'."
        )


def _count(path: str, source_format: str, csv_header: bool) -> int:
    try:
        if source_format == CSV:
            lines = csv_lines.count_nonempty_lines(path)
            return max(lines - 1, 0) if csv_header else lines
        if source_format == TFRECORD:
            return tfrecord_framing.count_records(path)
        return npy_layout.staged_record_count(path)
    except OSError as error:
        raise DataError(
            f"Cannot read input {path!r}: {error}. Fix: check that the file is "
            f"readable by the user running the job."
        ) from error


def _empty(path: str, source_format: str, csv_header: bool, size: int) -> DataError:
    detail = "it is empty"
    hint = ""
    if source_format == CSV and csv_header and size > 0:
        detail = "it has only a header line (csv_header=True)"
        hint = " If the first line is data rather than column names, pass csv_header=False."
    return DataError(
        f"Input {path!r} has 0 records: {detail}. An empty source cannot be cut into "
        f"tasks. Fix: remove it from `data` or narrow the glob to exclude it.{hint}"
    )
