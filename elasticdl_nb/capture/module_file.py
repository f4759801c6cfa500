"""A `Capture` as files: one readable Python module plus what it loads.

    source/captured_model.py   imports, values, the notebook's definitions, the contract
    source/values.pkl          the values that travel by value (cloudpickle)
    source/models/NAME.keras   Keras model objects (config + weights)
    source/<module>            the user's own modules, copied

The module is what the job imports, and what a user reads to see what was shipped.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

from elasticdl_nb.capture import keras_models
from elasticdl_nb.capture.autograph import restore_sources, sources_of
from elasticdl_nb.capture.collect import Capture
from elasticdl_nb.capture.definitions import Definition
from elasticdl_nb.capture.values import CaptureError

MODULE = "captured_model"


def write(capture: Capture, source: Path, limit_bytes: int) -> dict[str, Any]:
    """Write the capture under `source`; returns what the manifest records. Raises
    CaptureError, listing the largest parts, when it is bigger than `limit_bytes`."""
    source.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {name: len(data) for name, data in capture.values.items()}
    if capture.values:
        (source / "values.pkl").write_bytes(pickle.dumps(capture.values))
        (source / "values_sources.json").write_text(
            json.dumps(sources_of(capture.by_value_functions))
        )
    for name, model in capture.keras_models.items():
        path = source / "models" / f"{name}.keras"
        keras_models.save(model, path)
        sizes[f"Keras model {name}"] = path.stat().st_size
    for name, path in capture.local_modules.items():
        if path.is_dir():
            shutil.copytree(
                path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
            )
            sizes[f"module {name}"] = sum(f.stat().st_size for f in (source / name).rglob("*"))
        else:
            shutil.copy2(path, source / path.name)
            sizes[f"module {name}"] = path.stat().st_size
    total = sum(sizes.values())
    if total > limit_bytes:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        listed = ", ".join(f"{name} {size / 2**20:.1f} MB" for name, size in biggest)
        raise CaptureError(
            f"The captured model takes {total / 2**20:.1f} MB, over the "
            f"{limit_bytes / 2**20:.0f} MB limit (largest: {listed}). Fix: pass large "
            "arrays as the job's data (data=) instead of using them from the model "
            "functions, load big files inside the functions, or raise bundle_limit_mb=."
        )
    (source / f"{MODULE}.py").write_text(render(capture))
    return {
        "model_def": f"{MODULE}.custom_model",
        # Pickled values and Keras archives are only read back safely by the same
        # Python and TensorFlow; source and imports are not tied to either.
        "requires": ["python", "tensorflow"] if capture.values or capture.keras_models else [],
    }


def render(capture: Capture) -> str:
    """The text of the captured module."""
    out = [
        '"""The model as captured by elasticdl-nb from a notebook. Generated: edit the '
        'notebook, not this file."""',
        "",
        "from elasticdl_nb.capture.module_file import load_keras_model, load_values",
    ]
    out += sorted(set(capture.imports.values()))
    if capture.literals:
        out.append("")
        out += [f"{name} = {text}" for name, text in capture.literals.items()]
    if capture.values:
        out += ["", "_values = load_values(__file__)"]
        out += [f"{name} = _values[{name!r}]" for name in capture.values if name != "__compiled__"]
    for definition in _in_definition_order(capture.definitions):
        out += ["", "", definition.source.rstrip()]
    if capture.keras_models:
        out.append("")
        out += [
            f"{name} = load_keras_model(__file__, {name!r}, globals())"
            for name in capture.keras_models
        ]
    for text in capture.generated:
        out += ["", "", text.strip()]
    aliases = [f"{c} = {n}" for c, n in capture.contract.items() if c != n]
    if aliases:
        out += ["", "", *aliases]
    return "\n".join(out) + "\n"


def _in_definition_order(definitions: dict[str, Definition]) -> list[Definition]:
    """The notebook's order where known (file, line), but each definition after those its
    statement evaluates (a base class, a decorator)."""
    ordered: list[Definition] = []
    placed: set[str] = set()

    def place(d: Definition) -> None:
        if d.name in placed:
            return
        placed.add(d.name)
        for dep in sorted(d.needed_at_definition & definitions.keys()):
            place(definitions[dep])
        ordered.append(d)

    for d in sorted(definitions.values(), key=lambda d: (d.filename, d.line)):
        place(d)
    return ordered


# ---------------------------------------------------------------- used by the module


def load_values(module_file: str) -> dict[str, Any]:
    """The captured values, unpickled; by-value functions get their source back."""
    here = Path(module_file).parent
    pickles = pickle.loads((here / "values.pkl").read_bytes())
    values = {name: pickle.loads(data) for name, data in pickles.items()}
    sources = here / "values_sources.json"
    if sources.exists():
        restore_sources(values, json.loads(sources.read_text()))
    return values


def load_keras_model(module_file: str, name: str, namespace: dict[str, Any]) -> Any:
    return keras_models.load(Path(module_file).parent / "models" / f"{name}.keras", namespace)
