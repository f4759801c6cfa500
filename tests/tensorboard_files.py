"""A job's TensorBoard log as TensorBoard's own reader reads it (the tests' one way)."""

from __future__ import annotations

from pathlib import Path


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the log, tag -> [(step, value), ...] in file order, duplicates kept
    (TensorBoard would hide a step written twice by purging the older ones)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
