"""ElasticDL's `custom_data_reader`: a model's own reader, for data in a form of its own
(a table, a directory of files in a format of the user's, a service).

ElasticDL's contract, kept as it was: `custom_data_reader(data_origin, records_per_task=None,
**kwargs)` returns a reader whose `create_shards()` gives `{shard name: (first record,
records)}`, whose `read_records(task)` yields the records `[task.start, task.end)` of
shard `task.shard_name` in order, and whose `records_output_types` are their TensorFlow
dtype(s); its `metadata`, if any, is what `feed` gets. `data_origin` is what the job's
data option says (`data=`, `validation_data=`, `prediction_data=`), `kwargs` its
`data_reader_params`.

Where it is called: when a job is launched, each data option's reader cuts its data into
shards, which become the job's sources (`custom_sources`: format "custom", the shard's
name, first record and count); the master cuts them into tasks as it does files. Each
worker makes a reader per data option and reads its tasks' ranges through it
(`CustomRecords`); `feed` turns the records into features and labels, as for TFRecord.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from elasticdl_nb.data.errors import DataError
from elasticdl_nb.data.sources import CUSTOM, SourceInfo
from elasticdl_nb.model.contract import ContractError, ModelContract


@dataclass(frozen=True)
class ReaderTask:
    """What `read_records(task)` is given: the fields of ElasticDL's task it reads."""

    shard_name: str
    start: int
    end: int
    type: str  # the Mode the records are read for


def reader_params(text: str) -> dict[str, Any]:
    """ElasticDL's `--data_reader_params` ('key=value;key=value') as keyword arguments:
    a value that is a Python literal is that value, any other its text."""
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ContractError(
                f"data_reader_params: {item!r} is not key=value; write e.g. "
                "'sep=\"|\";columns=64' (items separated by ';')."
            )
        try:
            params[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            params[key.strip()] = value.strip()
    return params


def data_origin(option: str, given: list[str]) -> str:
    """The one data origin a data option gives a custom reader (ElasticDL's took one)."""
    if len(given) != 1:
        raise ContractError(
            f"{option}= gives {len(given)} data origins, and a custom_data_reader is made "
            f"for one (ElasticDL's data_origin): pass one string it understands, e.g. a "
            f"directory or a table name."
        )
    return given[0]


def make_reader(
    custom_data_reader: Callable[..., Any], origin: str, params: Mapping[str, Any], **more: Any
):
    """The model's reader for `origin`; ContractError naming what is missing."""
    try:
        reader = custom_data_reader(data_origin=origin, **more, **params)
    except TypeError as exc:
        raise ContractError(
            f"custom_data_reader(data_origin={origin!r}, ...) failed: {exc}. It is called "
            "as ElasticDL called it: custom_data_reader(data_origin, records_per_task=None, "
            "**kwargs), the kwargs from data_reader_params."
        ) from exc
    wanted = ("create_shards", "read_records", "records_output_types")
    missing = [name for name in wanted if getattr(reader, name, None) is None]
    if missing:
        raise ContractError(
            f"custom_data_reader() returned a {type(reader).__name__}, which lacks "
            f"{', '.join(missing)}: a reader has create_shards(), read_records(task) and "
            "records_output_types, as ElasticDL's AbstractDataReader."
        )
    return reader


def custom_sources(
    custom_data_reader: Callable[..., Any],
    option: str,
    origin: str,
    records_per_task: int,
    params: Mapping[str, Any],
) -> list[SourceInfo]:
    """The sources of a data option read by the model's reader: its shards, in order."""
    reader = make_reader(custom_data_reader, origin, params, records_per_task=records_per_task)
    shards = reader.create_shards()
    if not isinstance(shards, Mapping) or not shards:
        raise DataError(
            f"{option}: the custom reader's create_shards() for {origin!r} gave "
            f"{shards!r}: it must give {{shard name: (first record, records)}}, not empty."
        )
    sources = []
    for name, shard in shards.items():
        try:
            first, count = (int(n) for n in shard)
        except (TypeError, ValueError):
            raise DataError(
                f"{option}: shard {name!r} of the custom reader is {shard!r}, not "
                "(first record, records)."
            ) from None
        if first < 0 or count <= 0:
            raise DataError(
                f"{option}: shard {name!r} of the custom reader has {count} records from "
                f"{first}: a shard has at least one record, from 0 or later."
            )
        sources.append(SourceInfo(str(name), CUSTOM, count, origin=origin, offset=first))
    return sources


class CustomRecords:
    """A worker's reading of one data option's shards through the model's reader."""

    def __init__(self, contract: ModelContract, origin: str, params: Mapping[str, Any]):
        if contract.custom_data_reader is None:
            raise ContractError(
                f"The job's data ({origin!r}) is read by a custom_data_reader, and the model "
                "defines none."
            )
        self._reader = make_reader(contract.custom_data_reader, origin, params)
        self.metadata = getattr(self._reader, "metadata", None)

    def dataset(self, source: SourceInfo, start: int, end: int, mode: str):
        """The records [start, end) of `source` as a tf.data.Dataset, one element each."""
        import tensorflow as tf

        task = ReaderTask(source.uri, source.offset + start, source.offset + end, mode)
        spec = tf.nest.map_structure(
            lambda dtype: tf.TensorSpec(None, tf.as_dtype(dtype)),
            self._reader.records_output_types,
        )
        return tf.data.Dataset.from_generator(lambda: self._exactly(task), output_signature=spec)

    def _exactly(self, task: ReaderTask) -> Iterator[Any]:
        """The reader's records for `task`, checked to be as many as it asked for: a
        minibatch is known by its records' numbers, so a lost one is redone exactly."""
        wanted, n = task.end - task.start, 0
        for record in self._reader.read_records(task):
            if n == wanted:
                raise DataError(self._miscount(task, f"more than {wanted}"))
            n += 1
            yield record
        if n != wanted:
            raise DataError(self._miscount(task, str(n)))

    @staticmethod
    def _miscount(task: ReaderTask, given: str) -> str:
        return (
            f"The custom reader's read_records gave {given} records for [{task.start}, "
            f"{task.end}) of shard {task.shard_name!r}: it must give exactly "
            f"{task.end - task.start}, in order."
        )
