"""Layout of a staged-array directory, the on-disk form of in-memory training data.

A staged directory holds the features as `x.npy`, or as one `x.<key>.npy` per
key when the features are a dict, plus `y.npy` when there are labels. Each
array's first dimension is the record index. `stage_arrays` writes this layout,
`resolve_sources` recognises and counts it, and the npy reader slices it; all
three go through this module so they agree on file names.
"""

import os
from dataclasses import dataclass

import numpy as np

from elasticdl_nb.data.errors import DataError

FEATURES_STEM = "x"
LABELS_FILE = "y.npy"
NPY_SUFFIX = ".npy"

StagedFeatures = np.ndarray | dict[str, np.ndarray]


@dataclass(frozen=True)
class StagedArrayFiles:
    """Paths of one staged directory's files: a single features path or key -> path."""

    features: str | dict[str, str]
    labels: str | None


def features_file_name(key: str | None = None) -> str:
    """`x.npy` for plain features, `x.<key>.npy` for one entry of dict features."""
    if key is None:
        return FEATURES_STEM + NPY_SUFFIX
    return f"{FEATURES_STEM}.{key}{NPY_SUFFIX}"


def is_staged_file_name(name: str) -> bool:
    """Whether `name` is one of the files that make up the staged layout."""
    return name == LABELS_FILE or (
        name.startswith(FEATURES_STEM + ".") and name.endswith(NPY_SUFFIX)
    )


def looks_like_staged_dir(directory: str) -> bool:
    """Whether `directory` holds features files (it may still be inconsistent)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(is_staged_file_name(name) and name != LABELS_FILE for name in names)


def find_staged_files(directory: str) -> StagedArrayFiles:
    """Locate the features and labels files of a staged directory, or raise DataError."""
    names = sorted(os.listdir(directory))
    has_plain = features_file_name() in names
    keyed: dict[str, str] = {}
    for name in names:
        if name == features_file_name() or not is_staged_file_name(name) or name == LABELS_FILE:
            continue
        key = name[len(FEATURES_STEM) + 1 : -len(NPY_SUFFIX)]
        if not key.isidentifier():
            raise DataError(
                f"Staged-array directory {directory!r} contains {name!r}, whose "
                f"feature key {key!r} is not a Python identifier, so it cannot be "
                f"a dict-features file. Fix: rename or remove that file (feature "
                f"files are named x.npy or x.<identifier>.npy)."
            )
        keyed[key] = os.path.join(directory, name)
    if has_plain and keyed:
        raise DataError(
            f"Staged-array directory {directory!r} contains both x.npy and "
            f"x.<key>.npy files ({', '.join(sorted(keyed))}), so it is ambiguous "
            f"whether the features are one array or a dict. Fix: keep only one "
            f"form, e.g. re-stage the data with stage_arrays into an empty directory."
        )
    if not has_plain and not keyed:
        raise DataError(
            f"Directory {directory!r} is not a staged-array directory: it has no "
            f"x.npy or x.<key>.npy file. Fix: create it with stage_arrays(x, y, "
            f"directory), or, to read files inside it, pass a glob such as "
            f"'{os.path.join(directory, '*.csv')}'."
        )
    labels = os.path.join(directory, LABELS_FILE) if LABELS_FILE in names else None
    features = keyed if keyed else os.path.join(directory, features_file_name())
    return StagedArrayFiles(features=features, labels=labels)


def load_staged_arrays(directory: str) -> tuple[StagedFeatures, np.ndarray | None]:
    """Memory-map a staged directory's arrays after checking they line up.

    Returns (features, labels); features is an array or a dict of arrays and
    labels is None when there is no y.npy. Nothing is read into memory yet.
    """
    files = find_staged_files(directory)
    if isinstance(files.features, dict):
        features: StagedFeatures = {key: _open_array(path) for key, path in files.features.items()}
        named = {features_file_name(key): array for key, array in features.items()}
    else:
        features = _open_array(files.features)
        named = {features_file_name(): features}
    labels = _open_array(files.labels) if files.labels is not None else None
    if labels is not None:
        named[LABELS_FILE] = labels
    _check_same_length(directory, named)
    return features, labels


def staged_record_count(directory: str) -> int:
    """Number of records in a staged directory (the shared first dimension)."""
    features, _ = load_staged_arrays(directory)
    return record_count(features)


def record_count(features: StagedFeatures) -> int:
    """First dimension of already-loaded (and length-checked) features."""
    first = next(iter(features.values())) if isinstance(features, dict) else features
    return int(first.shape[0])


def _open_array(path: str) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise DataError(
            f"Cannot load {path!r} as a NumPy array: {error}. Staged arrays must be "
            f"numeric .npy files (no Python objects). Fix: re-stage the data with "
            f"stage_arrays, converting any object/str columns to numbers first."
        ) from error
    if array.ndim == 0:
        raise DataError(
            f"Array {path!r} is a scalar (0-dimensional); staged arrays need a first "
            f"dimension that indexes records. Fix: re-stage it with one entry per "
            f"record, e.g. np.atleast_1d(value)."
        )
    return array


def _check_same_length(directory: str, named: dict[str, np.ndarray]) -> None:
    (first_name, first), *others = named.items()
    for name, array in others:
        if array.shape[0] != first.shape[0]:
            raise DataError(
                f"Staged-array directory {directory!r} is inconsistent: {first_name} "
                f"has {first.shape[0]} records but {name} has {array.shape[0]}. "
                f"Every array needs the same first dimension (one row per record). "
                f"Fix: re-stage the data with stage_arrays from matching arrays."
            )
