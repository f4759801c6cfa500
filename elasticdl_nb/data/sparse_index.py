"""Where every k-th record of a remote source starts, so a task reads only its own bytes.

A local file is indexed by each worker in full (memory-mapped, fast). A remote
object cannot be: a worker would download the whole object to find where its
task starts. So when the sources are resolved (one pass over each object, which
counting needs anyway) the byte offsets of units 0, k, 2k, ... are kept, and
travel to the workers inside `SourceInfo`. A worker then fetches from the last
checkpoint at or before its task, at most k units more than the task itself.
Units are non-empty lines for CSV (the header line included) and records for
TFRecord. The source list travels in a Kubernetes ConfigMap (1 MiB in all), so
at most `MAX_CHECKPOINTS` offsets are kept per source and `TOTAL_CHECKPOINTS`
over all of a job's sources (see `checkpoints_per_source`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticdl_nb.data import csv_lines, tfrecord_framing
from elasticdl_nb.data.remote_files import ObjectStore

MAX_CHECKPOINTS = 256
TOTAL_CHECKPOINTS = 24_576  # about 300 kB of JSON
_MIN_CHECKPOINTS = 8
_FIRST_STRIDE = 64  # Units between checkpoints while scanning, before thinning.
_STREAM_BYTES = 8 * 2**20  # Bytes per request while scanning an object once.


@dataclass(frozen=True)
class SparseIndex:
    """Byte offsets of units 0, stride, 2·stride, ... of one object, its unit count, and
    its size and version tag when indexed (if they differ later, the object changed)."""

    stride: int
    offsets: tuple[int, ...]
    units: int
    size: int
    version: str = ""

    def checkpoint(self, unit: int) -> tuple[int, int]:
        """(the unit of the last checkpoint at or before `unit`, its byte offset)."""
        slot = min(unit // self.stride, len(self.offsets) - 1)
        return slot * self.stride, self.offsets[slot]

    def bytes_for(self, units: int) -> int:
        """A generous guess of how many bytes `units` consecutive units take."""
        average = self.size / max(self.units, 1)
        return int(average * units * 1.25) + 64 * 1024

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (inside `SourceInfo.to_dict`)."""
        return {
            "stride": self.stride,
            "offsets": list(self.offsets),
            "units": self.units,
            "size": self.size,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> SparseIndex:
        """Inverse of `to_dict`."""
        return cls(
            stride=int(fields["stride"]),
            offsets=tuple(int(o) for o in fields["offsets"]),
            units=int(fields["units"]),
            size=int(fields["size"]),
            version=str(fields.get("version", "")),
        )


def checkpoints_per_source(remote_sources: int) -> int:
    """How many checkpoints each of `remote_sources` sources may keep."""
    share = TOTAL_CHECKPOINTS // max(remote_sources, 1)
    return max(_MIN_CHECKPOINTS, min(MAX_CHECKPOINTS, share))


def index_csv(store: ObjectStore, url: str, max_checkpoints: int = MAX_CHECKPOINTS) -> SparseIndex:
    """Scan the CSV object at `url` once: its non-empty lines and their checkpoints."""
    size, version = store.stat(url)
    chunks = store.stream(url, size, _STREAM_BYTES)
    units, offsets = csv_lines.sparse_line_starts(chunks, _FIRST_STRIDE)
    return _thinned([int(o) for o in offsets], units, size, version, max_checkpoints)


def index_tfrecord(
    store: ObjectStore, url: str, max_checkpoints: int = MAX_CHECKPOINTS
) -> SparseIndex:
    """Walk the TFRecord object at `url` once (headers only): its records and checkpoints."""
    size, version = store.stat(url)
    units, offsets = tfrecord_framing.sparse_record_offsets(
        lambda start, stop: store.read(url, start, stop), size, url, _FIRST_STRIDE, _STREAM_BYTES
    )
    return _thinned(offsets, units, size, version, max_checkpoints)


def _thinned(
    offsets: list[int], units: int, size: int, version: str, max_checkpoints: int
) -> SparseIndex:
    step = max(1, math.ceil(len(offsets) / max_checkpoints))
    return SparseIndex(_FIRST_STRIDE * step, tuple(offsets[::step]), units, size, version)
