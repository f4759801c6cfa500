"""Which parameter server holds what: the same answer on every worker and PS.

Dense variables go whole to one PS, largest first onto the least loaded one (so shards are
balanced by bytes, and the choice depends only on the model). Embedding tables are split
by row: row `i` lives on PS `i % num_ps`, at local row `i // num_ps`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def place_dense(sizes: Sequence[tuple[str, int]], num_ps: int) -> dict[str, int]:
    """Map each dense variable name to a PS index, balancing bytes across PS."""
    load = [0] * num_ps
    placement: dict[str, int] = {}
    for name, size in sorted(sizes, key=lambda item: (-item[1], item[0])):
        ps = min(range(num_ps), key=lambda i: (load[i], i))
        placement[name] = ps
        load[ps] += size
    return placement


def rows_on_shard(table_rows: int, ps: int, num_ps: int) -> int:
    """How many rows of a `table_rows`-row table PS `ps` holds."""
    return len(range(ps, table_rows, num_ps))


def split_ids(ids: np.ndarray, num_ps: int) -> list[np.ndarray]:
    """Partition global row ids by PS; each part keeps the ids' order."""
    if num_ps == 1:
        return [ids]
    owner = ids % num_ps
    return [ids[owner == ps] for ps in range(num_ps)]
