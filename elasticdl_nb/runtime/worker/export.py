"""The export task's file: the whole trained Keras model where the master asked for it,
or, when its embedding tables are too large for one file, a note saying so."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np

from elasticdl_nb.runtime.job_dir import not_exported_note
from elasticdl_nb.runtime.table_def import TableDef
from elasticdl_nb.runtime.table_export import DENSE_FILE

log = logging.getLogger("elasticdl_nb.worker")

# Whole tables above this go into no `.keras` file: the exporting worker would hold them
# all at once, and so would every notebook that loads the model.
WHOLE_TABLES_MAX_BYTES = 2 << 30


def whole_tables_bytes(tables: list[TableDef]) -> float:
    """What the model's tables take whole (infinite for one whose ids are any int64)."""
    return sum(
        t.input_dim * t.dim * np.dtype(t.dtype).itemsize if t.input_dim else math.inf
        for t in tables
    )


def note_not_exported(path: Path, tables: list[TableDef], embeddings: Path) -> None:
    """Leave, instead of the model file, why there is none and where the rows went
    (`Job.model()` reads it)."""
    sizes = ", ".join(
        f"'{t.name}' {t.input_dim:,} rows" if t.input_dim else f"'{t.name}' any int64 ids"
        for t in tables
    )
    reason = (
        f"The model's embedding tables ({sizes}) take {whole_tables_bytes(tables) / 2**30:.1f} "
        f"GiB whole, more than the {WHOLE_TABLES_MAX_BYTES / 2**30:.0f} GiB a Keras model "
        f"file is written for, so no model.keras was exported. Their trained rows are "
        f"exported as (id, vector) files in {embeddings}, and the dense layers' weights in "
        f"{embeddings / DENSE_FILE}: read them with elasticdl_nb.load_embeddings(job)."
    )
    not_exported_note(path).write_text(reason + "\n")
    log.info("%s", reason)


def save_model(model, path: Path, worker_id: int) -> None:
    """Save `model` as `path` (.keras), whole or not at all, and its weights beside it."""
    partial = path.with_name(f"partial-{worker_id}-{path.name}")
    model.save(partial)
    os.replace(partial, path)  # whoever opens model.keras sees a whole file
    model.save_weights(path.with_name("model.weights.h5"))
    log.info("exported the model to %s", path)
