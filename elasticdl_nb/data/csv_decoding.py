"""Default conversion of CSV rows into float32 features and labels.

Used when the user supplies no feed function: every column except the label
column becomes a float32 feature, the label column becomes a float32 label.
Pure NumPy, so it runs on the master too (e.g. to validate a sample early).
"""

from collections.abc import Sequence

import numpy as np

from elasticdl_nb.data.errors import DataError


def default_decode_csv(
    rows: np.ndarray, column_names: Sequence[str], label_column: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Split CSV rows (2-D array of str) into (features float32 [n, k], labels float32 [n]).

    `label_column` None means the last column. Raises DataError naming the
    column and the first value that is not a number.
    """
    names = list(column_names)
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != len(names):
        raise DataError(
            f"CSV rows have shape {rows.shape} but {len(names)} column names were "
            f"given ({', '.join(names)}). Fix: pass the rows and the column_names "
            f"of the same reader."
        )
    if len(names) < 2:
        raise DataError(
            f"CSV data has {len(names)} column(s) ({', '.join(names)}); the default "
            f"decoding needs at least one feature column and one label column. "
            f"Fix: check csv_delimiter, or pass a feed function to decode the rows."
        )
    if label_column is None:
        label_index = len(names) - 1
    elif label_column in names:
        label_index = names.index(label_column)
    else:
        raise DataError(
            f"Label column {label_column!r} is not among the CSV columns "
            f"({', '.join(names)}). Fix: pass one of these as label_column, or None "
            f"to use the last column."
        )
    feature_indices = [i for i in range(len(names)) if i != label_index]
    features = _to_float32(rows[:, feature_indices], [names[i] for i in feature_indices])
    labels = _to_float32(rows[:, [label_index]], [names[label_index]])[:, 0]
    return features, labels


def default_decode_csv_features(
    rows: np.ndarray, column_names: Sequence[str], label_column: str | None = None
) -> np.ndarray:
    """CSV rows of prediction data (no labels to split off) as float32 features [n, k]:
    every column but `label_column`, when the data has that column."""
    names = list(column_names)
    rows = np.asarray(rows)
    keep = [i for i, name in enumerate(names) if name != label_column]
    return _to_float32(rows[:, keep], [names[i] for i in keep])


def _to_float32(block: np.ndarray, names: list[str]) -> np.ndarray:
    try:
        return block.astype(np.float32)
    except (ValueError, TypeError) as error:
        raise _non_numeric_error(block, names, error) from error


def _non_numeric_error(block: np.ndarray, names: list[str], error: Exception) -> DataError:
    # Slow path, only taken to build the message: find the first offending field.
    culprit = f"a non-numeric value ({error})"
    bad_fields = (
        (row_index, name, value)
        for row_index, row in enumerate(block)
        for name, value in zip(names, row, strict=True)
        if not _is_number(value)
    )
    first_bad = next(bad_fields, None)
    if first_bad is not None:
        row_index, name, value = first_bad
        shown = repr(value) if str(value).strip() else f"{value!r} (empty)"
        culprit = f"column {name!r} has the non-numeric value {shown} in row {row_index}"
    return DataError(
        f"Cannot decode CSV rows as numbers: {culprit}; the default decoding turns "
        f"every column into float32. Fix: clean or drop that column (e.g. encode "
        f"categories as numbers), or pass a feed function that decodes the rows."
    )


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return False
    return True
