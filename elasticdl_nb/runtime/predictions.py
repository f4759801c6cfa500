"""A job's predictions on disk: what its prediction tasks write and `Job.predictions()`
reads.

Each prediction task covers a record range of one prediction source and writes the
model's outputs for it to a file of its own, named by where the range starts
(`task_file`), whole: to a temporary name, then renamed. A task redone after its worker
was lost writes the same file again, so every record has exactly one prediction however
often its task ran (a `PredictionOutputsProcessor`, which is the user's code, may see a
redone minibatch twice, as in ElasticDL). Outputs keep the model's structure: one array,
a dict of them (a model with named outputs), or a list. NumPy only: the master names the
files and does not import TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

_ONE = "output"  # the key of a model's single output
_DICT, _LIST = "dict:", "list:"  # the prefixes of a dict's and a list's outputs


class IncompletePredictions(RuntimeError):
    """Not every record of the prediction data has its prediction (yet)."""


def task_file(directory: Path, source: int, start: int) -> Path:
    """The file of the predictions of the range of `source` that starts at `start`."""
    return directory / f"{source:05d}-{start:012d}.npz"


def write_task(path: Path, outputs: Sequence[Any]) -> int:
    """Write a task's outputs (one per minibatch, in order) to `path` at once; returns
    how many records they cover."""
    joined = {key: np.concatenate(parts) for key, parts in _by_key(outputs).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        np.savez(out, **joined)
    os.replace(tmp, path)
    return len(next(iter(joined.values()))) if joined else 0


def read_predictions(directory: Path, records_per_source: Sequence[int]) -> Any:
    """Every prediction, in the data's order, in the model's output structure; raises
    `IncompletePredictions` when files are missing or do not cover every record."""
    files = sorted(directory.glob("*.npz")) if directory.is_dir() else []
    parts: dict[str, list[np.ndarray]] = {}
    covered = [0] * len(records_per_source)
    for path in files:
        source, start = (int(p) for p in path.stem.split("-"))
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
        n = len(next(iter(arrays.values())))
        if source >= len(covered) or start != covered[source]:
            raise IncompletePredictions(
                f"{path.name} starts at record {start} of source {source}, but the files "
                f"before it end at {covered[source] if source < len(covered) else '?'}"
            )
        covered[source] += n
        for key, value in arrays.items():
            parts.setdefault(key, []).append(value)
    expected, have = sum(records_per_source), sum(covered)
    if have != expected or list(covered) != list(records_per_source):
        raise IncompletePredictions(f"{have:,} of {expected:,} records have predictions")
    return _structure({key: np.concatenate(values) for key, values in parts.items()})


def _by_key(outputs: Sequence[Any]) -> dict[str, list[np.ndarray]]:
    keyed: dict[str, list[np.ndarray]] = {}
    for output in outputs:
        if isinstance(output, Mapping):
            items = {f"{_DICT}{name}": value for name, value in output.items()}
        elif isinstance(output, list | tuple):
            items = {f"{_LIST}{i}": value for i, value in enumerate(output)}
        else:
            items = {_ONE: output}
        for key, value in items.items():
            keyed.setdefault(key, []).append(np.asarray(value))
    return keyed


def _structure(arrays: dict[str, np.ndarray]) -> Any:
    if _ONE in arrays:
        return arrays[_ONE]
    if any(key.startswith(_DICT) for key in arrays):
        return {key[len(_DICT) :]: value for key, value in arrays.items()}
    return [arrays[f"{_LIST}{i}"] for i in range(len(arrays))]
