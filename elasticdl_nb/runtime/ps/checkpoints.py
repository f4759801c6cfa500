"""PS checkpoints on disk: one `.npz` per (shard, version), written atomically, newest kept.

A checkpoint holds the shard's dense variables, its tables (definition, and the ids,
states and last updates of the rows held), the optimizer's variables (slots, iteration),
the version, the applied-batch record and the ledger, so a restored shard is exactly the
shard that wrote it.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from elasticdl_nb.runtime.ps.store import VariableSpec
from elasticdl_nb.runtime.table_def import TableDef


class CheckpointDir:
    def __init__(self, root: Path, ps_id: int, keep: int):
        self.dir = root / f"ps-{ps_id}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def save(self, state: dict) -> Path:
        arrays: dict[str, np.ndarray] = {}
        meta = {
            "version": state["version"],
            "variables": [],
            "tables": [],
            "applied": [[e, s, keys] for (e, s), keys in state["applied"].items()],
            "ledger": [[e, s, ranges] for (e, s), ranges in state["ledger"].items()],
            "row_rows": state.get("row_rows", []),
        }
        for i, spec in enumerate(state["variables"]):
            arrays[f"var{i}"] = spec.value
            meta["variables"].append(spec.name)
        for i, (definition, ids, states, updated, policy) in enumerate(state["tables"]):
            arrays[f"table{i}_ids"], arrays[f"table{i}_states"] = ids, states
            arrays[f"table{i}_updated"] = updated
            if policy["admission"] is not None:
                arrays[f"table{i}_admission"] = policy["admission"]
            meta["tables"].append([definition.to_json(), policy["counts"]])
        for i, value in enumerate(state["optimizer"]):
            arrays[f"opt{i}"] = value
        for i, value in enumerate(state["row_optimizer"]):
            arrays[f"rowopt{i}"] = value
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        path = self.dir / f"ckpt-{state['version']:012d}.npz"
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.write(buffer.getbuffer())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # a reader sees the old set or the new one, never half a file
        for old in self.paths()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    def paths(self) -> list[Path]:
        return sorted(self.dir.glob("ckpt-*.npz"))

    def load_newest(self) -> tuple[dict, Path] | None:
        """The newest readable checkpoint (skipping damaged ones), or None."""
        for path in reversed(self.paths()):
            try:
                with np.load(path) as data:
                    meta = json.loads(data["meta"].tobytes())
                    variables = [
                        VariableSpec(name, data[f"var{i}"])
                        for i, name in enumerate(meta["variables"])
                    ]
                    tables = [
                        (
                            TableDef.from_json(text),
                            data[f"table{i}_ids"],
                            data[f"table{i}_states"],
                            data[f"table{i}_updated"],
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
            except (OSError, ValueError, KeyError, TypeError):
                continue
            state = {
                "version": meta["version"],
                "variables": variables,
                "tables": tables,
                "optimizer": optimizer,
                "row_optimizer": row_optimizer,
                "applied": {(e, s): keys for e, s, keys in meta["applied"]},
                "ledger": {(e, s): ranges for e, s, ranges in meta["ledger"]},
                "row_rows": meta.get("row_rows", []),  # absent in older checkpoints
            }
            return state, path
        return None
