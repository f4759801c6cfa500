"""Writes in-memory training arrays to disk so they can be served as tasks.

A job given NumPy arrays instead of files stages them once into a directory
(`x.npy` or `x.<key>.npy` per dict key, plus `y.npy`); after that they are an
ordinary "npy" source that the master counts and workers slice by memory-map.
Everything is validated before anything is written, so a bad input never leaves
a half-staged directory behind.
"""

import os
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from elasticdl_nb.data import npy_layout
from elasticdl_nb.data.errors import DataError

# Kinds that TensorFlow can take straight from a memory-mapped array:
# bool, signed int, unsigned int, float, complex.
# Fixed-width kinds memory-map: numbers, bools, and bytes and unicode strings (string ids,
# hashed by elasticdl_nb.layers.Embedding). Object arrays (Python objects) do not.
_STAGEABLE_KINDS = frozenset("biufcSU")


def stage_arrays(x: Any, y: Any, directory: str) -> str:
    """Write features `x` (array-like or dict of them) and labels `y` (or None) to `directory`.

    Replaces any arrays staged there before and returns `directory`. Raises
    DataError, without writing anything, if the arrays are empty, not numeric,
    of different lengths, or if a dict key is not an identifier.
    """
    files = _validated_files(x, y)
    os.makedirs(directory, exist_ok=True)
    temporary: dict[str, str] = {}
    try:
        for name, array in files.items():
            # Hidden, non-.npy temporary names are never mistaken for staged files.
            path = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
            temporary[name] = path
            with open(path, "wb") as file:
                np.save(file, array, allow_pickle=False)
    except BaseException:
        for path in temporary.values():
            if os.path.exists(path):
                os.remove(path)
        raise
    # Stale files from an earlier staging (old dict keys, a y.npy that is no
    # longer wanted) would otherwise be picked up as part of this data.
    for name in os.listdir(directory):
        if npy_layout.is_staged_file_name(name) and name not in files:
            os.remove(os.path.join(directory, name))
    for name, path in temporary.items():
        os.replace(path, os.path.join(directory, name))
    return directory


def _validated_files(x: Any, y: Any) -> dict[str, np.ndarray]:
    """File name -> array for everything to write, after all checks pass."""
    files: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    if isinstance(x, Mapping):
        if not x:
            raise DataError(
                "x is an empty dict, so there are no features to stage. Fix: pass at "
                "least one array, e.g. {'pixels': images}."
            )
        for key, value in x.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise DataError(
                    f"Feature key {key!r} of x is not a valid identifier; keys become "
                    f"file names (x.<key>.npy) and Keras input names. Fix: rename it "
                    f"to letters, digits and underscores, not starting with a digit."
                )
            files[npy_layout.features_file_name(key)] = _as_array(value, f"x[{key!r}]")
    else:
        files[npy_layout.features_file_name()] = _as_array(x, "x")
    if y is not None:
        labels[npy_layout.LABELS_FILE] = _as_array(y, "y", strings=False)
    names = {file_name: _display_name(file_name) for file_name in (*files, *labels)}
    files.update(labels)
    (first_file, first), *others = files.items()
    for file_name, array in others:
        if len(array) != len(first):
            raise DataError(
                f"Cannot stage arrays of different lengths: {names[first_file]} has "
                f"{len(first)} records but {names[file_name]} has {len(array)}. "
                f"Every array needs one row per record. Fix: pass features and labels "
                f"with the same first dimension."
            )
    return files


def _as_array(value: Any, name: str, strings: bool = True) -> np.ndarray:
    """`value` as an array that can be staged; `strings`: fixed-width strings allowed
    (features: string ids; labels must be numbers a loss can take)."""
    try:
        array = np.asarray(value)
    except ValueError as error:  # Ragged nested lists.
        raise DataError(
            f"{name} cannot be turned into a NumPy array ({error}). Fix: pass a "
            f"rectangular numeric array, padding or splitting ragged rows first."
        ) from error
    if array.ndim == 0:
        raise DataError(
            f"{name} is a scalar; it needs a first dimension with one entry per "
            f"record. Fix: pass an array of shape [num_records, ...]."
        )
    if (
        strings
        and array.dtype.kind == "O"
        and len(array)
        and isinstance(array.flat[0], str | bytes)
    ):
        array = array.astype(str)  # strings in an object array: fixed width
    kinds = _STAGEABLE_KINDS if strings else _STAGEABLE_KINDS - {"S", "U"}
    if array.dtype.kind not in kinds:
        allowed = "numeric, bool and string" if strings else "numeric and bool"
        raise DataError(
            f"{name} has dtype {array.dtype}, which cannot be staged; only {allowed} "
            f"arrays can be memory-mapped for training here. Fix: convert it to numbers "
            f"first (e.g. encode categories as integers, then np.asarray(..., "
            f"dtype=np.float32))" + (", or to np.asarray(..., dtype=str)." if strings else ".")
        )
    if len(array) == 0:
        raise DataError(
            f"{name} has 0 records, so there is nothing to train on. Fix: pass at least one record."
        )
    return array


def _display_name(file_name: str) -> str:
    if file_name == npy_layout.LABELS_FILE:
        return "y"
    if file_name == npy_layout.features_file_name():
        return "x"
    key = file_name[len(npy_layout.FEATURES_STEM) + 1 : -len(npy_layout.NPY_SUFFIX)]
    return f"x[{key!r}]"
