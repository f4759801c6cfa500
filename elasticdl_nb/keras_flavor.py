"""Which Keras a process runs, and what tells a job's processes which one to run.

TensorFlow decides what `tf.keras` is once per process, when it is imported: Keras 3, or
Keras 2 (the `tf_keras` package) when `TF_USE_LEGACY_KERAS` is set. A job runs the Keras
its model was written for (`keras_version`: model code that only Keras 2 runs, such as a
functional model that applies `tf.*` functions to its symbolic tensors), in every one of
its processes; every module of ours that touches the user's model, its optimizer or its
metrics imports Keras from here, so it is the same Keras as the model's.
"""

from __future__ import annotations

import os
from typing import Any

LEGACY_ENV = "TF_USE_LEGACY_KERAS"
LEGACY = os.environ.get(LEGACY_ENV, "") in ("1", "true", "True")  # (TensorFlow's reading)
VERSION = "2" if LEGACY else "3"


def __getattr__(name: str) -> Any:
    """`keras`, imported when first asked for (the launcher reads this module too, and
    imports no TensorFlow)."""
    if name != "keras":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module("tf_keras" if LEGACY else "keras")
    globals()["keras"] = module
    return module


# What a model written only for Keras 2 meets in Keras 3 when it is built (the start of
# Keras 3's message): the sign that it is a Keras-2 model.
KERAS_2_ONLY = "A KerasTensor cannot be used as input to a TensorFlow function"


def environ_for(version: str) -> dict[str, str]:
    """The environment that makes a job's process run Keras `version` ('2' or '3'):
    to be added to its environment after removing `LEGACY_ENV`."""
    return {LEGACY_ENV: "1"} if version == "2" else {}


def optimizer_variables(optimizer: Any) -> list:
    """An optimizer's variables (its iteration count and slots): a property in Keras 3,
    a method in tf_keras."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def variable_name(variable: Any) -> str:
    """A variable's name path ('dense/kernel'): Keras 3's `path`, tf_keras's `name`."""
    return getattr(variable, "path", None) or variable.name.removesuffix(":0")


__all__ = ["LEGACY", "VERSION", "environ_for", "optimizer_variables", "variable_name"]
