"""The model bundle: a directory that carries the model contract to the job's processes.

Two kinds, recorded in `manifest.json` with the versions that made it:
- `module`: an ElasticDL model-zoo file or package, copied as source; `model_def` names
  the function ('package.module.custom_model');
- `captured`: functions or a Keras model given in memory (a notebook, a script), turned
  into a module by `elasticdl_nb.capture`; what it pickled ties it to the same Python
  and TensorFlow, which the manifest lists under `requires`.

Here: the format and loading, which every job process needs. Writing a bundle is the
notebook side's work: `elasticdl_nb.capture.write_bundle`.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import threading
from importlib import metadata
from pathlib import Path

from elasticdl_nb.model.contract import ContractError, ModelContract

FORMAT = 1

# Loading puts the bundle's source on sys.path and its module in sys.modules (a captured
# one is taken out first): two threads loading at once would pull them from under each
# other (seen: KeyError from importlib in a master's evaluator and callbacks threads).
_LOADING = threading.Lock()


class BundleError(ContractError):
    """The bundle cannot be made or loaded here; the message says why and what to do."""


def versions() -> dict[str, str]:
    """What a bundle records of the process that made it (and a loader compares)."""

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


def load_bundle(path: Path) -> ModelContract:
    """Load the contract from a bundle, refusing one this process cannot honour."""
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest.get("format") != FORMAT:
        raise BundleError(
            f"Bundle format {manifest.get('format')} is not supported by this "
            f"elasticdl-nb (format {FORMAT}): use the same elasticdl-nb version "
            "on both sides."
        )
    here = versions()
    for key in manifest.get("requires", []):
        if manifest[key] != here[key]:
            raise BundleError(
                f"The model was captured with {key} {manifest[key]} but this process runs "
                f"{key} {here[key]}. Its pickled values and Keras weights need the same "
                f"{key} on both sides: align the versions, or define the model in a "
                "model-zoo file (model_zoo=, model_def=), which travels as source."
            )
    with _LOADING:
        return _load_module(path, manifest)


def _load_module(path: Path, manifest: dict) -> ModelContract:
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
