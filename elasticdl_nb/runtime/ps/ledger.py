"""Read the per-record ledger out of a finished job's final PS checkpoints.

With `record_ledger=True`, every PS shard notes the record range of each minibatch whose
gradients it applied, in the same state it checkpoints. So the newest checkpoint of each
shard says which records the saved model contains, and how often: exactly once per epoch
is the promise, whatever was killed along the way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.ps.checkpoints import CheckpointDir


def record_counts(
    job_dir: Path, ps_id: int, records_per_source: list[int]
) -> dict[tuple[int, int], np.ndarray]:
    """{(epoch, source): applications per record} from shard `ps_id`'s newest checkpoint."""
    newest = CheckpointDir(JobDir(job_dir).checkpoints, ps_id, keep=1_000_000).load_newest()
    if newest is None:
        raise FileNotFoundError(f"PS {ps_id} of {job_dir} has no checkpoint")
    state, _ = newest
    counts: dict[tuple[int, int], np.ndarray] = {}
    for (epoch, source), ranges in state["ledger"].items():
        tally = counts.setdefault((epoch, source), np.zeros(records_per_source[source], np.int64))
        for start, end in ranges:
            tally[start:end] += 1
    return counts


def ledger_problems(
    job_dir: Path, num_ps: int, records_per_source: list[int], epochs: int
) -> list[str]:
    """Every way the ledger breaks 'each record exactly once per epoch'; empty if none."""
    problems = []
    for ps_id in range(num_ps):
        counts = record_counts(job_dir, ps_id, records_per_source)
        for epoch in range(epochs):
            for source, n in enumerate(records_per_source):
                tally = counts.get((epoch, source), np.zeros(n, np.int64))
                for label, bad in (
                    ("never applied", tally == 0),
                    ("applied twice or more", tally > 1),
                ):
                    if bad.any():
                        where = np.flatnonzero(bad)
                        problems.append(
                            f"PS {ps_id} epoch {epoch} source {source}: "
                            f"{where.size} records {label}, e.g. {where[:5].tolist()}"
                        )
        extra = sorted(k for k in counts if k[0] >= epochs)
        if extra:
            problems.append(f"PS {ps_id}: records applied in epochs beyond {epochs}: {extra}")
    return problems
