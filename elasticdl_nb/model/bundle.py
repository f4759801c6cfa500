"""The model bundle: a directory that carries the model contract to the job's processes.

Two kinds, recorded in `manifest.json` with the versions that made it:
- `module`: an ElasticDL model-zoo file or package, copied as source; `model_def` names
  the function ('package.module.custom_model');
- `captured`: functions or a Keras model given in memory (a notebook, a script), turned
  into a module by `elasticdl_nb.capture`; what it pickled ties it to the same Python
  and TensorFlow, which the manifest lists under `requires`.
"""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from elasticdl_nb.model.contract import ContractError, ModelContract, install_elasticdl_compat

FORMAT = 1


class BundleError(ContractError):
    """The bundle cannot be made or loaded here; the message says why and what to do."""


def _versions() -> dict[str, str]:
    def version(*dists: str) -> str:
        for dist in dists:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return "unknown"

    return {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "tensorflow": version("tensorflow", "tensorflow-cpu"),
        "elasticdl_nb": version("elasticdl-nb"),
    }


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
    manifest: dict[str, Any] = {"format": FORMAT, **_versions()}
    if functions is not None:
        from elasticdl_nb.capture import module_file
        from elasticdl_nb.capture.collect import collect

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


def load_bundle(path: Path) -> ModelContract:
    """Load the contract from a bundle, refusing one this process cannot honour."""
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest.get("format") != FORMAT:
        raise BundleError(
            f"Bundle format {manifest.get('format')} is not supported by this "
            f"elasticdl-nb (format {FORMAT}): use the same elasticdl-nb version "
            "on both sides."
        )
    here = _versions()
    for key in manifest.get("requires", []):
        if manifest[key] != here[key]:
            raise BundleError(
                f"The model was captured with {key} {manifest[key]} but this process runs "
                f"{key} {here[key]}. Its pickled values and Keras weights need the same "
                f"{key} on both sides: align the versions, or define the model in a "
                "model-zoo file (model_zoo=, model_def=), which travels as source."
            )
    install_elasticdl_compat()
    source = str(path / "source")
    module_name, fn_name = manifest["model_def"].rsplit(".", 1)
    where = f"model-zoo module '{module_name}'"
    if manifest["kind"] == "captured":
        # A notebook launches many jobs: each must get its own captured module, never
        # the one an earlier job's check left in sys.modules or on sys.path.
        sys.modules.pop(module_name, None)
        if source in sys.path:
            sys.path.remove(source)
        where = "the captured model"
    if source not in sys.path:
        sys.path.insert(0, source)
    module = importlib.import_module(module_name)
    return ModelContract.from_namespace(vars(module), fn_name, where=where)
