"""Keras model objects in a capture: saved as config + weights, rebuilt in the job.

`model = keras.Sequential(...)` in a notebook becomes a `.keras` file in the bundle, and
`custom_model()` in the job loads a fresh copy of it. A model compiled in the notebook
also brings its loss and optimizer, so `model.compile(...)` is all a user has to write.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def is_keras_model(value: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, keras.Model)


def notebook_layer_classes(model: Any) -> list[type]:
    """Layer (and model) classes the notebook itself defined, which the job must have
    before it can rebuild the model from its config."""
    classes = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        cls = type(layer)
        if cls.__module__ == "__main__" and cls not in classes:
            classes.append(cls)
    return classes


def save(model: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)


def compiled_parts(model: Any) -> dict[str, Any]:
    """What `model.compile(...)` set that the contract can use: 'loss' (serialized) and
    'optimizer' (its config), each only when it was given."""
    from elasticdl_nb.keras_flavor import keras

    parts: dict[str, Any] = {}
    if getattr(model, "optimizer", None) is not None and getattr(model, "compiled", False):
        parts["optimizer"] = keras.optimizers.serialize(model.optimizer)
    loss = getattr(model, "loss", None)
    if loss is not None and not isinstance(loss, list | dict):
        parts["loss"] = keras.losses.serialize(keras.losses.get(loss))
    return parts


def load(path: Path, namespace: dict[str, Any]) -> Any:
    """Rebuild a captured model; the notebook's own classes resolve from `namespace`."""
    from elasticdl_nb.keras_flavor import keras

    custom = {k: v for k, v in namespace.items() if isinstance(v, type)}
    # safe_mode off: the archive is the user's own model, and Lambda layers need it.
    return keras.saving.load_model(path, custom_objects=custom, compile=False, safe_mode=False)


# The contract functions of a compiled model, written into the captured module. They use
# Keras under a name of their own: the notebook's `keras` may be bound to something else
# (`from tensorflow import keras`).
KERAS_IMPORT = "import keras as _keras"
COMPILED_LOSS = """
_compiled_loss = _keras.losses.deserialize(_values["__compiled__"]["loss"])


def loss(labels, predictions):
    # Keras' loss functions give one value per example; the contract wants a scalar.
    return _keras.ops.mean(_compiled_loss(labels, predictions))
"""

COMPILED_OPTIMIZER = """
def optimizer():
    return _keras.optimizers.deserialize(_values["__compiled__"]["optimizer"])
"""
