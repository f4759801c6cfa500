"""From a task's record range to minibatches of (features, labels).

With a `feed` function, the records of each minibatch go through `feed(dataset, mode,
metadata)` separately (inside one tf.data pipeline per task), so whatever `feed` does —
parsing, shuffling — stays inside the minibatch, and minibatch k of a task is always
records [start + k·B, start + (k+1)·B): that is what lets a lost worker's unfinished
minibatches be redone exactly. Without `feed`, arrays go straight in and CSV columns are
decoded as numbers.

Records a model's own `custom_data_reader` reads (model/custom_data_reader.py) go
through `feed` the same way, a task's range read through the reader.

Prediction data has no labels: in `Mode.PREDICTION` a feed may give features alone (as
ElasticDL's do), staged arrays may be x alone, and a CSV's columns are all features but
the label column when it has one by that name (`label_column`); a batch's `labels` is None.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from elasticdl_nb.data import (
    SourceInfo,
    default_decode_csv,
    default_decode_csv_features,
    open_reader,
)
from elasticdl_nb.data.sources import CUSTOM
from elasticdl_nb.model.contract import ContractError, Mode, ModelContract
from elasticdl_nb.model.custom_data_reader import CustomRecords, reader_params
from elasticdl_nb.spec import JobSpec


@dataclass
class Batch:
    source: int
    start: int
    end: int
    features: Any
    labels: Any


@dataclass
class Metadata:
    """What `feed` gets as `metadata` (ElasticDL passed the same field)."""

    column_names: list[str] | None = None


def _split(element: Any, mode: str) -> tuple[Any, Any]:
    if isinstance(element, tuple) and len(element) == 2:
        return element
    if mode == Mode.PREDICTION:
        return element, None  # (features alone)
    raise ContractError(
        "feed() must produce (features, labels) pairs for training and "
        f"evaluation; it produced {type(element).__name__}."
    )


class BatchMaker:
    def __init__(self, sources: list[SourceInfo], contract: ModelContract, spec: JobSpec):
        self.sources = sources
        self.contract = contract
        self.feed = contract.feed
        self.spec = spec
        self.batch = spec.minibatch_size
        self._readers: dict[Any, Any] = {}  # by source; a custom reader by its data origin

    def _reader(self, source: int):
        info = self.sources[source]
        key = ("custom", info.origin) if info.format == CUSTOM else source
        if key not in self._readers:
            if info.format == CUSTOM:
                params = reader_params(self.spec.data_reader_params)
                self._readers[key] = CustomRecords(self.contract, info.origin, params)
            else:
                self._readers[key] = open_reader(
                    info, csv_header=self.spec.csv_header, csv_delimiter=self.spec.csv_delimiter
                )
        return self._readers[key]

    def batches(self, source: int, start: int, end: int, mode: str) -> Iterator[Batch]:
        reader = self._reader(source)
        fmt = self.sources[source].format
        if self.feed is not None and fmt == CUSTOM:
            records = reader.dataset(self.sources[source], start, end, mode)
            yield from self._fed(records, reader.metadata, source, start, end, mode)
            return
        if self.feed is not None:
            records = tf.data.Dataset.from_tensor_slices(reader.read(start, end))
            metadata = Metadata(getattr(reader, "column_names", None))
            yield from self._fed(records, metadata, source, start, end, mode)
            return
        if fmt in ("tfrecord", CUSTOM):
            what = "TFRecord data" if fmt == "tfrecord" else "A custom_data_reader's records"
            raise ContractError(
                f"{what} needs a feed(dataset, mode, metadata) function "
                "that parses the serialized records into (features, labels)."
            )
        for b in range(start, end, self.batch):
            e = min(b + self.batch, end)
            records = reader.read(b, e)
            if fmt == "csv" and mode == Mode.PREDICTION:
                features = default_decode_csv_features(
                    records, reader.column_names, self.spec.label_column or None
                )
                labels = None
            elif fmt == "csv":
                features, labels = default_decode_csv(
                    records, reader.column_names, self.spec.label_column or None
                )
            elif isinstance(records, tuple):
                features, labels = records
            elif mode == Mode.PREDICTION:
                features, labels = records, None
            else:
                raise ContractError("The staged arrays have no labels: pass data=(x, y).")
            yield Batch(source, b, e, features, labels)

    def _fed(
        self, records, metadata, source: int, start: int, end: int, mode: str
    ) -> Iterator[Batch]:
        """`records` (a dataset of the task's records, one element each) through `feed`,
        a minibatch at a time."""
        raw = records.batch(self.batch)
        feed, size = self.feed, self.batch

        def per_batch(*parts):
            one = parts[0] if len(parts) == 1 else parts
            return feed(tf.data.Dataset.from_tensor_slices(one), mode, metadata).batch(size)

        starts = range(start, end, self.batch)
        for b, element in zip(starts, raw.flat_map(per_batch)):
            features, labels = _split(element, mode)
            yield Batch(source, b, min(b + self.batch, end), features, labels)


def first_batch(maker: BatchMaker, mode: str) -> Batch:
    """One minibatch from the start of the first source (to build and check the model)."""
    source = maker.sources[0]
    return next(maker.batches(0, 0, min(maker.batch, source.num_records), mode))
