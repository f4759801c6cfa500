"""The PS's embedding-table work per step, alone: `read` (a pull's rows), `states` and
`write` (a push's update) of one table on one PS, every id held, as in a CTR job's steady
state.

    .venv/bin/python bench/profile_tables.py   (~10 s)

One `EmbeddingTable` of the CTR workload's shape (10,000 ids × 16, one optimizer slot),
all of its ids written first; then 200 minibatches of 256 ids drawn with the CTR data's
Zipf-like popularity, deduplicated as a push's ids are. Prints the median µs per
minibatch of 7 passes. A CTR step does this for each of its four tables. It is the
numpy-call cost `bench/results/step_profile.md` shows as the PS's table phases, without
the rest of the step around it.
"""

from __future__ import annotations

import time

import numpy as np

from elasticdl_nb.runtime.ps.tables.table import EmbeddingTable
from elasticdl_nb.runtime.table_def import TableDef


def main() -> None:
    rng = np.random.default_rng(0)
    table = EmbeddingTable(TableDef("t", 16, input_dim=10_000), np.zeros((1, 16), np.float32))
    every = np.arange(10_000)
    rows, states = table.states(every)
    table.write(every, rows, states, 1)
    popularity = 1.0 / np.arange(1, 10_001) ** 0.8
    batches = [
        np.unique(rng.choice(10_000, 256, p=popularity / popularity.sum())) for _ in range(200)
    ]
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for ids in batches:
            table.read(ids)
            rows, states = table.states(ids)
            table.write(ids, rows, states, 2)
        runs.append((time.perf_counter() - start) / len(batches) * 1e6)
    size = np.mean([len(b) for b in batches])
    print(
        f"read + states + write of one table, {size:.0f} distinct ids a minibatch: "
        f"median {np.median(runs):.1f} µs (passes: {', '.join(f'{r:.0f}' for r in runs)})"
    )


if __name__ == "__main__":
    main()
