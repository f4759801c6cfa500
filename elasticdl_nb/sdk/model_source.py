"""Turn what the caller passes as `model` into a contract check and a bundle.

Accepted: 'module.custom_model' (with model_zoo=), a module object, a mapping of the
contract's functions, or the `custom_model` function itself with the others given as
keyword arguments (loss=, optimizer=, feed=, eval_metrics_fn=, callbacks=).
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from elasticdl_nb.model.contract import OPTIONAL, REQUIRED, ContractError, ModelContract

FUNCTION_NAMES = REQUIRED + OPTIONAL + ("dataset_fn",)


def functions_of(model: Any, extra: Mapping[str, Callable | None]) -> dict[str, Any] | None:
    """The contract functions to serialize, or None for a model-zoo string."""
    given = {k: v for k, v in extra.items() if v is not None}
    if model is None or isinstance(model, str):
        if given:
            raise ContractError(
                f"{', '.join(sorted(given))} given with a model-zoo model_def: "
                "the model-zoo module defines them itself."
            )
        return None
    if isinstance(model, types.ModuleType):
        namespace = {n: getattr(model, n) for n in FUNCTION_NAMES if hasattr(model, n)}
    elif isinstance(model, Mapping):
        namespace = dict(model)
    elif callable(model):
        namespace = {"custom_model": model}
    else:
        raise ContractError(
            f"model= must be 'module.custom_model', a module, a dict of "
            f"functions or the custom_model function; got {type(model).__name__}."
        )
    namespace.update(given)
    unknown = set(namespace) - set(FUNCTION_NAMES)
    if unknown:
        raise ContractError(
            f"Unknown model function(s) {sorted(unknown)}; the contract knows "
            f"{', '.join(FUNCTION_NAMES)}."
        )
    ModelContract.from_namespace(namespace, where="the functions given to train()")
    _ship_local_modules_by_value(namespace.values())
    return namespace


def _ship_local_modules_by_value(functions) -> None:
    """Functions from the caller's own modules (a script, a test file) travel by value:
    the job's processes could not import those modules by name."""
    import cloudpickle

    installed = (Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
    for fn in functions:
        module = inspect.getmodule(fn)
        if (
            module is None
            or module.__name__ == "__main__"
            or module.__name__ in sys.builtin_module_names
        ):
            continue
        path = getattr(module, "__file__", None)
        if path and not any(Path(path).resolve().is_relative_to(p) for p in installed):
            cloudpickle.register_pickle_by_value(module)
