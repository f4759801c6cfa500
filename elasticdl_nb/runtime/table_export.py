"""The sharded export of embedding tables too large for one Keras file: (id, vector) files.

Each PS writes the rows it holds of each table (`ps-I-of-N.npz`: `ids` int64, `vectors`
[len(ids), dim]) under `<directory>/<table name>/`, beside the table's definition
(`table.json`); the exporting worker adds the dense variables (`dense.npz`, by variable
path). A table is whole when all N shards are there. Ids a PS never trained are not in
the files: they read as their initial rows (`table_def.initial_rows`, from `table.json`).
Files are written whole or not at all (a temporary name, then renamed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from elasticdl_nb.runtime.table_def import TableDef

DENSE_FILE = "dense.npz"


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        np.savez(out, **arrays)
    os.replace(tmp, path)


def write_shard(
    directory: Path, table: TableDef, ps: int, num_ps: int, ids: np.ndarray, vectors: np.ndarray
) -> Path:
    """One PS's rows of `table`."""
    where = directory / table.name
    where.mkdir(parents=True, exist_ok=True)
    definition = where / "table.json"
    if not definition.exists():
        tmp = where / f".table.json.{ps}.tmp"
        tmp.write_text(table.to_json())
        os.replace(tmp, definition)
    path = where / f"ps-{ps}-of-{num_ps}.npz"
    _write_npz(path, ids=ids, vectors=vectors)
    return path


def write_dense(directory: Path, dense: dict[str, np.ndarray]) -> None:
    # npz keys cannot hold "/" portably: the paths go in as a separate list.
    names = np.array(list(dense), dtype=object).astype(str)
    _write_npz(
        directory / DENSE_FILE, names=names, **{f"v{i}": v for i, v in enumerate(dense.values())}
    )


def table_names(directory: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(directory)) for p in directory.rglob("table.json"))


def read_table(directory: Path, name: str) -> tuple[TableDef, np.ndarray, np.ndarray]:
    """(definition, ids sorted, their vectors) of an exported table; FileNotFoundError
    if it is not there whole."""
    where = directory / name
    if not (where / "table.json").exists():
        raise FileNotFoundError(
            f"no exported table {name!r} in {directory}: there are {table_names(directory)}"
        )
    definition = TableDef.from_json((where / "table.json").read_text())
    shards = sorted(where.glob("ps-*-of-*.npz"))
    expected = int(shards[0].stem.split("-of-")[1]) if shards else 0
    if not shards or len(shards) != expected:
        raise FileNotFoundError(f"table {name!r} in {where} has {len(shards)} of {expected} shards")
    ids, vectors = [], []
    for shard in shards:
        with np.load(shard) as data:
            ids.append(data["ids"])
            vectors.append(data["vectors"])
    ids_all, vectors_all = np.concatenate(ids), np.concatenate(vectors)
    order = np.argsort(ids_all, kind="stable")
    return definition, ids_all[order], vectors_all[order]


def read_dense(directory: Path) -> dict[str, np.ndarray]:
    with np.load(directory / DENSE_FILE) as data:
        return {str(name): data[f"v{i}"] for i, name in enumerate(data["names"])}
