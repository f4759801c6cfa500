"""The model bundle: a directory that carries the model contract to the job's processes.

Two kinds, recorded in `manifest.json` with the versions that made it:
- `module`: an ElasticDL model-zoo file or package, copied as source; `model_def` names
  the function ('package.module.custom_model');
- `functions`: contract functions given in memory (a notebook, a script), serialized by
  value with cloudpickle, which ties the bundle to the same Python and TensorFlow.
"""

from __future__ import annotations

import importlib
import json
import linecache
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
) -> dict[str, Any]:
    """Write a bundle into `dest` (created) from a model zoo or from functions."""
    dest.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": FORMAT, **_versions()}
    if functions is not None:
        import cloudpickle

        try:
            payload = cloudpickle.dumps(dict(functions))
        except Exception as exc:  # what cannot be pickled is named in the message
            raise BundleError(
                f"Cannot serialize the model functions: {exc}. Define them at "
                "the top level of the notebook or script, or put them in a "
                "model-zoo file and pass model_zoo=/model_def=."
            ) from exc
        (dest / "functions.pkl").write_bytes(payload)
        (dest / "sources.json").write_text(json.dumps(_sources(functions)))
        manifest.update(kind="functions", model_def="custom_model")
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


def _sources(functions: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Where each function was defined, and the text of those files (or notebook cells).

    Functions travel by value without their source (cloudpickle even renames their file
    to '<dynamic-code>'), and TensorFlow's AutoGraph reads a function's source to
    convert its Python control flow: with this, the contract functions convert in the
    job exactly as they do in the notebook."""
    files: dict[str, str] = {}
    where: dict[str, str] = {}
    for name, fn in functions.items():
        code = getattr(fn, "__code__", None)
        lines = linecache.getlines(code.co_filename) if code else []
        if lines and _defines(lines, code):
            where[name] = code.co_filename
            files[code.co_filename] = "".join(lines)
    return {"files": files, "functions": where}


def _defines(lines: list[str], code) -> bool:
    """Whether `lines` still hold the function where its code says it starts. A module
    file edited after it was imported no longer does; shipping that text would make
    AutoGraph convert other code than the function's (without a source, it leaves the
    function unconverted, which is right for everything but Python control flow on
    tensors)."""
    first = code.co_firstlineno - 1
    if first >= len(lines):
        return False
    if code.co_name == "<lambda>":
        return "lambda" in lines[first]
    if not lines[first].lstrip().startswith(("@", "def ", "async def ")):
        return False
    for line in lines[first : first + 50]:  # past the decorators, to the def itself
        text = line.lstrip()
        if text.startswith(("def ", "async def ")):
            return text.split("def ", 1)[1].startswith(f"{code.co_name}(")
    return False


def _restore_sources(namespace: dict[str, Any], sources: dict[str, dict[str, str]]) -> None:
    for filename, text in sources["files"].items():
        if not linecache.getlines(filename):
            # mtime None: linecache never drops the entry for a file it cannot stat.
            linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    for name, filename in sources["functions"].items():
        fn = namespace.get(name)
        if fn is not None and hasattr(fn, "__code__"):
            fn.__code__ = fn.__code__.replace(co_filename=filename)


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
    if manifest["kind"] == "functions":
        for key in ("python", "tensorflow"):
            if manifest[key] != here[key]:
                raise BundleError(
                    f"The model functions were serialized with {key} "
                    f"{manifest[key]} but this process runs {key} {here[key]}. "
                    "Functions travel by value and need the same version on both "
                    "sides: align the versions or use a model-zoo file."
                )
        import cloudpickle

        namespace = cloudpickle.loads((path / "functions.pkl").read_bytes())
        sources = path / "sources.json"
        if sources.exists():
            _restore_sources(namespace, json.loads(sources.read_text()))
        return ModelContract.from_namespace(namespace, where="the functions given to train()")
    install_elasticdl_compat()
    source = str(path / "source")
    if source not in sys.path:
        sys.path.insert(0, source)
    module_name, fn_name = manifest["model_def"].rsplit(".", 1)
    module = importlib.import_module(module_name)
    return ModelContract.from_namespace(
        vars(module), fn_name, where=f"model-zoo module '{module_name}'"
    )
