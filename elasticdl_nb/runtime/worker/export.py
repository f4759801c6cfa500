"""What the export task writes where the master asked for it (`export_model`): the whole
trained Keras model (`model.keras`), a TensorFlow SavedModel with a serving signature
(`saved_model/`), or both (JobSpec `export_format`); when its embedding tables are too
large for one file, a note in place of each, saying so and where the rows went."""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path

import numpy as np

from elasticdl_nb.keras_flavor import LEGACY
from elasticdl_nb.runtime.job_dir import not_exported_note
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
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


def too_large_to_export(tables: list[TableDef]) -> str:
    """Why tables whose whole size is over `WHOLE_TABLES_MAX_BYTES` go into no model file,
    as the end of a sentence about them: the size, or (a table without input_dim takes
    any int64 id) that it is unknown."""
    limit = f"{WHOLE_TABLES_MAX_BYTES / 2**30:.0f} GiB"
    size = whole_tables_bytes(tables)
    if size == math.inf:
        return (
            "can hold any int64 id (no input_dim), so their size whole is unknown, and a "
            f"model file is written only for tables known to take at most {limit}"
        )
    return f"take {size / 2**30:.1f} GiB whole, more than the {limit} a model file is written for"


def note_not_exported(task: pb.Task, tables: list[TableDef], embeddings: Path) -> None:
    """Leave, instead of each model the task asked for, why there is none and where the
    rows went (`Job.model()` and `Job.saved_model_path` read it)."""
    sizes = ", ".join(
        f"'{t.name}' {t.input_dim:,} rows" if t.input_dim else f"'{t.name}' any int64 ids"
        for t in tables
    )
    where = (
        f"Their trained rows are exported as (id, vector) files in {embeddings}, and the "
        f"dense layers' weights in {embeddings / DENSE_FILE}: read them with "
        "elasticdl_nb.load_embeddings(job)."
    )
    too_large = f"The model's embedding tables ({sizes}) {too_large_to_export(tables)}"
    notes = []
    if task.export_path:
        notes.append((task.export_path, f"{too_large}, so no model.keras was exported."))
    if task.saved_model_path:
        notes.append(
            (
                task.saved_model_path,
                f"{too_large}, so no SavedModel was exported (a SavedModel holds its "
                "tables whole too; export_format='saved_model' cannot serve tables that "
                "live on the parameter servers).",
            )
        )
    for path, reason in notes:
        not_exported_note(Path(path)).write_text(f"{reason} {where}\n")
        log.info("%s %s", reason, where)


def export_model(model, task: pb.Task, worker_id: int) -> None:
    """Write what the export task asks for: the Keras file, the SavedModel, or both."""
    if task.export_path:
        save_model(model, Path(task.export_path), worker_id)
    if task.saved_model_path:
        save_saved_model(model, Path(task.saved_model_path), worker_id)


def save_model(model, path: Path, worker_id: int) -> None:
    """Save `model` as `path` (.keras), whole or not at all, and its weights beside it."""
    partial = path.with_name(f"partial-{worker_id}-{path.name}")
    model.save(partial)
    os.replace(partial, path)  # whoever opens model.keras sees a whole file
    model.save_weights(path.with_name("model.weights.h5"))
    log.info("exported the model to %s", path)


def save_saved_model(model, path: Path, worker_id: int) -> None:
    """Export `model` as a TensorFlow SavedModel in the folder `path`, its inference as
    the `serve` endpoint and the `serving_default` signature (Keras's `model.export`), whole
    or not at all."""
    partial = path.with_name(f"partial-{worker_id}-{path.name}")
    shutil.rmtree(partial, ignore_errors=True)
    if LEGACY:  # (tf_keras's export has no format: it writes a SavedModel)
        model.export(str(partial))
    else:
        model.export(str(partial), format="tf_saved_model", verbose=False)
    shutil.rmtree(path, ignore_errors=True)  # (an export done again: its worker was lost)
    os.replace(partial, path)
    log.info("exported the SavedModel to %s", path)
