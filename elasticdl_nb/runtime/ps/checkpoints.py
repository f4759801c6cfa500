"""PS checkpoints on disk: one `.npz` per (shard, version), written atomically.

A checkpoint holds the shard's dense variables, the optimizer's variables (slots,
iteration), the version, the applied-batch record and the ledger, so a restored shard is
exactly the shard that wrote it; and its embedding tables, whole (`ckpt-V.npz`, a *base*)
or as a delta (`delta-V.npz`): the rows updated and the ids evicted since the checkpoint
it follows (its `parent`), so a large table is not rewritten for the rows a few hundred
minibatches changed. Reading a delta folds its chain back to the base into whole tables.

The newest `keep` bases are kept, with the deltas that follow them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from elasticdl_nb.runtime.ps.store import VariableSpec
from elasticdl_nb.runtime.ps.tables.table import TableSnapshot
from elasticdl_nb.runtime.table_def import TableDef

_TABLE_ARRAYS = ("ids", "states", "updated", "removed")


class CheckpointDir:
    def __init__(self, root: Path, ps_id: int, keep: int):
        self.dir = root / f"ps-{ps_id}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def save(self, state: dict) -> Path:
        """Write a checkpoint: a delta if `state["parent"]` is the version of one on disk
        (`ParameterStore.snapshot(since=...)`), else a base."""
        parent = state.get("parent")
        arrays: dict[str, np.ndarray] = {}
        meta = {
            "version": state["version"],
            "parent": parent,
            "variables": [],
            "tables": [],
            "applied": [[e, s, keys] for (e, s), keys in state["applied"].items()],
            "ledger": [[e, s, ranges] for (e, s), ranges in state["ledger"].items()],
            "row_rows": state.get("row_rows", []),
            "learning_rate": state.get("learning_rate", 0.0),
        }
        for i, spec in enumerate(state["variables"]):
            arrays[f"var{i}"] = spec.value
            meta["variables"].append(spec.name)
        for i, table in enumerate(state["tables"]):
            for name in _TABLE_ARRAYS:
                arrays[f"table{i}_{name}"] = getattr(table, name)
            if table.policy["admission"] is not None:
                arrays[f"table{i}_admission"] = table.policy["admission"]
            meta["tables"].append([table.definition.to_json(), table.policy["counts"]])
        for i, value in enumerate(state["optimizer"]):
            arrays[f"opt{i}"] = value
        for i, value in enumerate(state["row_optimizer"]):
            arrays[f"rowopt{i}"] = value
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        kind = "ckpt" if parent is None else "delta"
        path = self.dir / f"{kind}-{state['version']:012d}.npz"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as out:  # (straight to the file: no second copy in memory)
            np.savez(out, **arrays)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # a reader sees the old set or the new one, never half a file
        self._prune()
        return path

    def paths(self) -> list[Path]:
        """Every checkpoint, bases and deltas, oldest first."""
        return sorted(
            [*self.dir.glob("ckpt-*.npz"), *self.dir.glob("delta-*.npz")],
            key=lambda p: (_version(p), p.name.startswith("delta")),
        )

    def _prune(self) -> None:
        bases = [p for p in self.paths() if p.name.startswith("ckpt-")]
        if len(bases) <= self.keep:
            return
        oldest_kept = _version(bases[-self.keep])
        for path in self.paths():
            if _version(path) < oldest_kept:
                path.unlink(missing_ok=True)

    def load_newest(self) -> tuple[dict, Path] | None:
        """The newest readable checkpoint, its tables whole (a delta folded into its
        chain), skipping one that is damaged or whose chain is; or None."""
        for path in reversed(self.paths()):
            try:
                chain = [_read(path)]  # newest first, back to the base
                while chain[-1]["parent"] is not None:
                    chain.append(_read(self._path_of(chain[-1]["parent"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            state, tables = chain[0], chain[-1]["tables"]
            for delta in reversed(chain[:-1]):  # whole tables, brought forward delta by delta
                tables = [t.fold(d) for t, d in zip(tables, delta["tables"], strict=True)]
            state["tables"] = tables
            return state, path
        return None

    def _path_of(self, version: int) -> Path:
        base = self.dir / f"ckpt-{version:012d}.npz"
        return base if base.exists() else self.dir / f"delta-{version:012d}.npz"


def _version(path: Path) -> int:
    return int(path.stem.split("-")[1])


def _read(path: Path) -> dict:
    """One checkpoint file as a state (a delta's tables as deltas)."""
    with np.load(path) as data:
        meta = json.loads(data["meta"].tobytes())
        variables = [
            VariableSpec(name, data[f"var{i}"]) for i, name in enumerate(meta["variables"])
        ]
        tables = [
            TableSnapshot(
                TableDef.from_json(text),
                *(data[f"table{i}_{name}"] for name in _TABLE_ARRAYS),
                {
                    "counts": counts,
                    "admission": data[f"table{i}_admission"]
                    if f"table{i}_admission" in data.files
                    else None,
                },
            )
            for i, (text, counts) in enumerate(meta["tables"])
        ]
        n_opt = sum(1 for key in data.files if key.startswith("opt"))
        optimizer = [data[f"opt{i}"] for i in range(n_opt)]
        n_row = sum(1 for key in data.files if key.startswith("rowopt"))
        row_optimizer = [data[f"rowopt{i}"] for i in range(n_row)]
    return {
        "version": meta["version"],
        "parent": meta.get("parent"),
        "variables": variables,
        "tables": tables,
        "optimizer": optimizer,
        "row_optimizer": row_optimizer,
        "applied": {(e, s): keys for e, s, keys in meta["applied"]},
        "ledger": {(e, s): ranges for e, s, ranges in meta["ledger"]},
        "row_rows": meta.get("row_rows", []),
        "learning_rate": meta.get("learning_rate", 0.0),
    }
