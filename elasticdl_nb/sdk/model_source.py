"""Turn what the caller passes as `model` into the contract entries to capture.

Accepted: 'module.custom_model' (with model_zoo=), a module object, a mapping of the
contract's functions, the `custom_model` function itself with the others given as
keyword arguments (loss=, optimizer=, feed=, eval_metrics_fn=, callbacks=,
prediction_outputs_processor=), or a Keras
model object (compiled, or with loss= and optimizer=).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

from elasticdl_nb.capture.keras_models import compiled_parts, is_keras_model
from elasticdl_nb.model.contract import (
    ALIASES,
    OPTIONAL,
    REQUIRED,
    ContractError,
    ModelContract,
)

FUNCTION_NAMES = REQUIRED + OPTIONAL + tuple(ALIASES)


def functions_of(model: Any, extra: Mapping[str, Callable | None]) -> dict[str, Any] | None:
    """The contract entries to capture, or None for a model-zoo string."""
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
    elif callable(model):  # a function, or a Keras model object
        namespace = {"custom_model": model}
    else:
        raise ContractError(
            f"model= must be 'module.custom_model', a module, a dict of functions, the "
            f"custom_model function or a Keras model; got {type(model).__name__}."
        )
    namespace.update(given)
    unknown = set(namespace) - set(FUNCTION_NAMES)
    if unknown:
        raise ContractError(
            f"Unknown model function(s) {sorted(unknown)}; the contract knows "
            f"{', '.join(FUNCTION_NAMES)}."
        )
    check = dict(namespace)
    if is_keras_model(namespace.get("custom_model")):
        compiled = compiled_parts(namespace["custom_model"])
        for part in ("loss", "optimizer"):
            if check.get(part) is None and part in compiled:
                check[part] = _from_compile
        if check.get("loss") is None or check.get("optimizer") is None:
            raise ContractError(
                "The Keras model has no loss or no optimizer: compile it first "
                "(model.compile(optimizer='adam', loss=...)) or pass loss= and optimizer=."
            )
    ModelContract.from_namespace(check, where="the functions given to train()")
    return namespace


def _from_compile(*args: Any) -> None:
    """Stands in, for the contract check, for a loss or optimizer that model.compile() gave."""
