"""The export task's file: the whole trained Keras model where the master asked for it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("elasticdl_nb.worker")


def save_model(model, path: Path, worker_id: int) -> None:
    """Save `model` as `path` (.keras), whole or not at all, and its weights beside it."""
    partial = path.with_name(f"partial-{worker_id}-{path.name}")
    model.save(partial)
    os.replace(partial, path)  # whoever opens model.keras sees a whole file
    model.save_weights(path.with_name("model.weights.h5"))
    log.info("exported the model to %s", path)
