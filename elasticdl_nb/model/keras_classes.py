"""The Keras classes a model's code defines: what loading its saved model needs.

Keras writes a custom layer (loss, metric, initializer...) into a model file by its class
name, and when loading finds it only among Keras's own classes, the ones registered with
`keras.saving.register_keras_serializable`, or `custom_objects`. A model-zoo module's or a
notebook's classes are none of these, so `Job.model()` passes what `keras_classes` finds:
every Keras class the contract's functions reach, through their globals and closures, and
on from those classes' own methods (a layer built of other custom layers), not Keras's.
"""

from __future__ import annotations

import functools
import sys
import sysconfig
import types
from dataclasses import fields
from pathlib import Path

from elasticdl_nb.model.contract import ModelContract


def _saveable_bases() -> tuple[type, ...]:
    from elasticdl_nb.keras_flavor import keras

    return (
        keras.layers.Layer,  # models too
        keras.losses.Loss,
        keras.metrics.Metric,
        keras.optimizers.schedules.LearningRateSchedule,
        keras.initializers.Initializer,
        keras.regularizers.Regularizer,
        keras.constraints.Constraint,
    )


def _referenced(value: object) -> list[object]:
    """What a function or class refers to: a function's globals and closure cells, a
    class's bases and attributes (its methods, and through them their globals)."""
    if isinstance(value, types.FunctionType):
        cells = [cell.cell_contents for cell in value.__closure__ or () if _filled(cell)]
        return [*value.__globals__.values(), *cells]
    if isinstance(value, type):
        return [*value.__bases__, *vars(value).values()]
    if isinstance(value, staticmethod | classmethod):
        return [value.__func__]
    return []


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def _installed(value: object) -> bool:
    """Whether `value` comes from an installed library or the standard library (not
    the model's code: what it refers to is not followed)."""
    return _installed_package(str(getattr(value, "__module__", "")).split(".")[0])


@functools.cache
def _installed_package(name: str) -> bool:
    where = getattr(sys.modules.get(name), "__file__", None)
    if not where:
        return False  # (a notebook's __main__, a captured module: the model's code)
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(Path(where).resolve().is_relative_to(Path(r).resolve()) for r in roots)


def keras_classes(contract: ModelContract) -> dict[str, type]:
    """Class name -> class, for every Keras class not Keras's own that the contract's
    functions reach (`keras.models.load_model(..., custom_objects=...)`)."""
    bases = _saveable_bases()
    roots = [getattr(contract, f.name) for f in fields(contract)]
    found: dict[str, type] = {}
    seen: set[int] = set()
    pending = [root for root in roots if root is not None]
    while pending:
        value = pending.pop()
        if id(value) in seen or isinstance(value, types.ModuleType):
            continue  # (a module's whole namespace is not what the code refers to)
        seen.add(id(value))
        is_keras = str(getattr(value, "__module__", "")).split(".")[0] == "keras"
        if isinstance(value, type) and issubclass(value, bases) and not is_keras:
            found.setdefault(value.__name__, value)
        if not _installed(value):
            pending.extend(_referenced(value))
    return found
