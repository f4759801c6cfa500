"""`load_embeddings`: a job's embedding tables as exported when they were too large for a
Keras model file (runtime/table_export.py): each table's trained (id, vector) rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elasticdl_nb.runtime.table_def import initial_rows
from elasticdl_nb.runtime.table_export import read_dense, read_table, table_names
from elasticdl_nb.sdk.errors import NoModelYet


class ExportedTable:
    """One exported table: `ids` (sorted) and their trained `vectors`; `lookup(ids)` gives
    any id's vector, an untrained one's as the table started it."""

    def __init__(self, name: str, definition, ids: np.ndarray, vectors: np.ndarray):
        self.name, self.definition, self.ids, self.vectors = name, definition, ids, vectors

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, ids: Any) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        at = np.clip(np.searchsorted(self.ids, ids), 0, max(len(self.ids) - 1, 0))
        trained = (self.ids[at] == ids) if len(self.ids) else np.zeros(len(ids), bool)
        out = initial_rows(self.definition, ids)
        out[trained] = self.vectors[at[trained]]
        return out


@dataclass
class ExportedModel:
    """What a job with tables too large for a Keras file exported: its tables by name,
    and its dense variables by variable path."""

    tables: dict[str, ExportedTable]
    dense: dict[str, np.ndarray]


def load_embeddings(source: Any) -> ExportedModel:
    """The exported tables and dense variables of a job (a `Job`, its directory, or the
    `embeddings` directory itself)."""
    directory = Path(getattr(source, "dir", source))
    if (directory / "embeddings").is_dir():
        directory = directory / "embeddings"
    names = table_names(directory) if directory.is_dir() else []
    if not names:
        raise NoModelYet(
            f"{directory} holds no exported embedding tables: a job exports them there "
            "when it succeeds and its tables are too large for a Keras model file "
            "(otherwise job.model() has them)."
        )
    tables = {name: ExportedTable(name, *read_table(directory, name)) for name in names}
    return ExportedModel(tables, read_dense(directory))
