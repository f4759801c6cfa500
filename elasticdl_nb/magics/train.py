"""`%%elasticdl train [flags]`: run the cell, capture its model, check it, launch, show.

The cell runs first, in the notebook's own namespace, exactly as without the magic, so its
definitions stay usable here. The model is then looked up in that namespace: a Keras
model the cell assigns (or the one `--model NAME` names), or a `custom_model()` function;
`loss`, `optimizer`, `feed`, `eval_metrics_fn` and `callbacks` are taken from the
namespace when they are functions there, `callbacks` also as a list of callbacks (a
compiled model brings its own loss and optimizer). `--data` and `--validation-data` take
file paths, or the names of notebook variables holding arrays (`--data x_train y_train`);
a name that is neither a variable nor a file is refused saying both.
`edl.train` then captures, checks on one minibatch, and only then launches.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from typing import Any

from elasticdl_nb.capture.keras_models import is_keras_model
from elasticdl_nb.commands import flag as option_flag
from elasticdl_nb.model.contract import ALIASES, OPTIONAL, REQUIRED
from elasticdl_nb.spec import SpecError, closest

# The contract's entries a cell may define, by their names first, then by other names
# they go by (ElasticDL's `dataset_fn`, `PredictionOutputsProcessor`).
CONTRACT = REQUIRED[1:] + OPTIONAL + tuple(ALIASES)


def names_assigned(cell: str) -> list[str]:
    """Names a cell binds at its top level, in order (`model = ...`, `x, y = ...`)."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name) and sub.id not in names:
                    names.append(sub.id)
    return names


def model_entries(namespace: Mapping[str, Any], cell: str, model_name: str | None) -> dict:
    """The contract entries for `edl.train`, looked up in the notebook's namespace."""
    if model_name:
        if model_name not in namespace:
            raise SpecError(f"--model {model_name}: no variable {model_name!r} in the notebook.")
        model = namespace[model_name]
        if not (is_keras_model(model) or callable(model)):
            raise SpecError(
                f"--model {model_name}: it is a {type(model).__name__}, not a Keras model "
                "or a function that builds one."
            )
    else:
        assigned = [n for n in names_assigned(cell) if is_keras_model(namespace.get(n))]
        if len(assigned) > 1:
            raise SpecError(
                f"The cell assigns several Keras models ({', '.join(assigned)}): "
                "say which to train with --model NAME."
            )
        if assigned:
            model = namespace[assigned[0]]
        elif callable(namespace.get("custom_model")):
            model = namespace["custom_model"]
        else:
            raise SpecError(
                "The cell defines no model: assign a Keras model (model = "
                "keras.Sequential(...), then model.compile(...)) or define custom_model() "
                "returning one; or name it with --model NAME."
            )
    entries = {"custom_model": model}
    for name in CONTRACT:
        value = namespace.get(name)
        if callable(value) or (name == "callbacks" and isinstance(value, list | tuple)):
            # (`callbacks = [EarlyStopping(...)]` as for fit)
            entries.setdefault(ALIASES.get(name, name), value)
    return entries


def resolve_data(namespace: Mapping[str, Any], option: str, items: list[str] | None) -> Any:
    """`--data` items: notebook variable names become their values, else file paths. A
    name that is neither (a misspelt variable, most likely) is refused saying both."""
    if not items:
        return None
    flag = option_flag(option)
    for item in items:
        if item.isidentifier() and item not in namespace and not os.path.exists(item):
            raise SpecError(
                f"{flag} {item}: no notebook variable named {item} and no file matches "
                f"{item}{_variable_hint(namespace, item)}. Pass the names of the feature "
                f"and label arrays ({flag} x y), or file paths or globs."
            )
    variables = [item for item in items if item.isidentifier() and item in namespace]
    if not variables:
        return items
    if len(variables) < len(items):
        raise SpecError(
            f"{flag} {' '.join(items)}: {', '.join(variables)} "
            f"{'is a notebook variable' if len(variables) == 1 else 'are notebook variables'}"
            f", the rest paths: pass either the arrays' names ({flag} x y) or file paths."
        )
    values = [namespace[item] for item in variables]
    if len(values) == 1 and hasattr(values[0], "shape") and option != "prediction_data":
        raise SpecError(
            f"{flag} {items[0]}: one array, without labels: name the labels' array too "
            f"({flag} {items[0]} LABELS)."
        )
    if len(values) == 1:
        return values[0]
    if len(values) == 2:
        return tuple(values)
    raise SpecError(
        f"{flag} takes one variable (a path or an (x, y) tuple) or "
        f"two (features, labels); got {len(values)}: {' '.join(items)}."
    )


def _variable_hint(namespace: Mapping[str, Any], name: str) -> str:
    """' (did you mean x_train?)' when a notebook variable holding data is close to `name`."""
    data = [
        key
        for key, value in namespace.items()
        if not key.startswith("_") and (hasattr(value, "shape") or isinstance(value, tuple))
    ]
    close = closest(name, data)
    return f" (did you mean {close}?)" if close else ""
