"""`write_bundle`: a model bundle (see `elasticdl_nb.model.bundle` for its format) made
from a model-zoo module, copied as source, or from functions and Keras objects given in
memory, captured into a module (`collect`, `module_file`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticdl_nb.capture import module_file
from elasticdl_nb.capture.collect import collect
from elasticdl_nb.model.bundle import FORMAT, BundleError, versions


def write_bundle(
    dest: Path,
    *,
    model_zoo: str = "",
    model_def: str = "",
    functions: Mapping[str, Any] | None = None,
    namespace: Mapping[str, Any] | None = None,
    limit: int = 100 * 2**20,
) -> dict[str, Any]:
    """Write a bundle into `dest` (created) from a model zoo, or from the contract
    functions (`custom_model` may be a Keras model) and the namespace they come from."""
    dest.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": FORMAT, **versions()}
    if functions is not None:
        captured = collect(functions, namespace)
        manifest.update(kind="captured", **module_file.write(captured, dest / "source", limit))
        (dest / "captured.txt").write_text(captured.summary() + "\n")
    else:
        zoo = Path(model_zoo).expanduser().resolve()
        if not zoo.exists():
            raise BundleError(
                f"model_zoo {model_zoo!r} does not exist (looked for {zoo}). "
                "Pass the .py file or the directory that holds the module."
            )
        source = dest / "source"
        if zoo.is_file():
            source.mkdir(exist_ok=True)
            shutil.copy2(zoo, source / zoo.name)
            if "." not in model_def:  # 'custom_model' alone: the function of that file
                model_def = f"{zoo.stem}.{model_def}"
        else:
            shutil.copytree(
                zoo,
                source,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"),
            )
        if "." not in model_def:
            raise BundleError(
                f"model_def {model_def!r} must name the module and the function, "
                "e.g. 'mnist.custom_model'."
            )
        module_path = model_def.rsplit(".", 1)[0].replace(".", "/")
        if not (
            (source / f"{module_path}.py").exists()
            or (source / module_path / "__init__.py").exists()
        ):
            raise BundleError(
                f"model_def {model_def!r}: no module '{module_path}.py' in model_zoo {str(zoo)!r}."
            )
        manifest.update(kind="module", model_def=model_def)
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
