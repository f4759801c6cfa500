"""Walk from the model's contract functions to everything they use, and sort it by how it
travels.

Every global name a captured definition reads is looked up in the namespace it was
defined in (the notebook's) and becomes one of:
- an import, for modules and for functions/classes of installed packages;
- a definition, as source, for functions and classes written in the notebook (their own
  references are walked in turn);
- a Keras model, saved as config + weights;
- a copied module, for a module of the user's own that is not installed;
- a value, pickled, for everything else (after refusing what only lives in this process).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticdl_nb.capture import keras_models
from elasticdl_nb.capture.definitions import Definition, find_definition
from elasticdl_nb.capture.values import CaptureError, pickled, refuse_local_only

_INSTALLED = tuple({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()})


@dataclass
class Capture:
    """What a model needs, sorted by how it travels; `module_file.write` turns it into files."""

    imports: dict[str, str] = field(default_factory=dict)  # bound name -> statement
    definitions: dict[str, Definition] = field(default_factory=dict)
    literals: dict[str, str] = field(default_factory=dict)  # name -> its Python literal
    values: dict[str, bytes] = field(default_factory=dict)  # name -> pickled bytes
    by_value_functions: dict[str, Any] = field(default_factory=dict)  # for their source
    keras_models: dict[str, Any] = field(default_factory=dict)
    local_modules: dict[str, Path] = field(default_factory=dict)  # top-level name -> path
    contract: dict[str, str] = field(default_factory=dict)  # contract name -> bound name
    generated: list[str] = field(default_factory=list)  # contract functions we write
    compiled: dict[str, Any] = field(default_factory=dict)  # from model.compile(...)

    def summary(self) -> str:
        """One line saying what was captured and how, for the user to check."""
        parts = []
        for label, names in (
            ("source", list(self.definitions)),
            ("Keras model", list(self.keras_models)),
            ("value", [*self.literals, *(v for v in self.values if v != "__compiled__")]),
            ("module", list(self.local_modules)),
            ("import", [n for n in self.imports if not n.startswith("_")]),  # ours: not news
        ):
            if names:
                parts.append(f"{label}: {', '.join(sorted(names))}")
        return "; ".join(parts)


def _origin(module: types.ModuleType | None) -> str:
    """'notebook', 'installed' (a package or the standard library) or 'local'."""
    if module is None:
        return "installed"
    if module.__name__ == "__main__":
        return "notebook"
    if module.__name__.split(".")[0] == "elasticdl_nb":
        return "installed"  # every job process runs it (even from a source checkout)
    path = getattr(module, "__file__", None)
    if not path:
        return "installed"  # built-in or frozen
    resolved = Path(path).resolve()
    return "installed" if any(resolved.is_relative_to(p) for p in _INSTALLED) else "local"


def _is_code(value: Any) -> bool:
    return inspect.isfunction(value) or inspect.isclass(value) or hasattr(value, "python_function")


class _Collector:
    def __init__(self) -> None:
        self.capture = Capture()
        self._bound: dict[str, Any] = {}
        self.by_value: dict[str, tuple[Any, str]] = {}  # pickled last: see `finish`

    def finish(self) -> Capture:
        """Pickle the by-value objects, once every local module they come from has been
        registered for pickling by value (a lambda may use a module seen only later)."""
        for name, (value, used_by) in self.by_value.items():
            self.capture.values[name] = pickled(name, value, used_by)
        return self.capture

    def add(self, name: str, value: Any, namespace: Mapping[str, Any], used_by: str) -> None:
        """Capture `value` so that the job's module binds it to `name`."""
        if name in self._bound:
            if self._bound[name] is not value:
                raise CaptureError(
                    f"Two different objects would be captured as {name!r} (one used by "
                    f"{used_by}): rename one of them."
                )
            return
        self._bound[name] = value
        cap = self.capture
        if isinstance(value, types.ModuleType):
            self._module(name, value, used_by)
        elif keras_models.is_keras_model(value):
            cap.keras_models[name] = value
            for cls in keras_models.notebook_layer_classes(value):
                self.add(cls.__name__, cls, namespace, f"Keras model {name!r}")
        elif _is_code(value) and self._code(name, value, namespace):
            pass
        elif not _is_code(value) and _import_of(name, value):  # e.g. numpy's ufuncs
            cap.imports[name] = _import_of(name, value)
        elif _literal(value) is not None:
            cap.literals[name] = _literal(value)
        else:
            if _is_code(value):
                module = inspect.getmodule(value)
                if _origin(module) == "local":
                    import cloudpickle  # the job cannot import the user's own module by name

                    cloudpickle.register_pickle_by_value(module)
                cap.by_value_functions[name] = value
            refuse_local_only(name, value, used_by)  # now, to name the variable early
            self.by_value[name] = (value, used_by)

    def _code(self, name: str, value: Any, namespace: Mapping[str, Any]) -> bool:
        """Capture a function or class as source or as an import; False: by value."""
        module = inspect.getmodule(getattr(value, "python_function", value))
        origin = _origin(module)
        if origin == "notebook":
            definition = find_definition(value)
            if definition is None or definition.name != name:
                return False  # a lambda, a nested function, or bound under another name
            self.capture.definitions[name] = definition
            scope = _scope_of(value, namespace)
            for ref in sorted(definition.needed_at_definition | definition.needed_at_call):
                self.follow(ref, scope, name)
            return True
        if origin == "installed":
            statement = _import_of(name, value)
            if statement:
                self.capture.imports[name] = statement
                return True
        return False

    def _module(self, name: str, module: types.ModuleType, used_by: str) -> None:
        if _origin(module) == "local":
            top = module.__name__.split(".")[0]
            path = Path((sys.modules.get(top) or module).__file__)
            self.capture.local_modules[top] = path.parent if path.name == "__init__.py" else path
        elif sys.modules.get(module.__name__) is not module:
            # A lazy stand-in (`from tensorflow import keras`) is not what sys.modules
            # holds, but its name imports the real module all the same.
            try:
                importlib.import_module(module.__name__)
            except ImportError:
                raise CaptureError(
                    f"Cannot capture {name!r} (used by {used_by}): it is a module that "
                    f"cannot be imported by its name {module.__name__!r}. Fix: import it "
                    "by name."
                ) from None
        real = _by_tensorflow_s_name(module.__name__)
        short = real.rsplit(".", 1)[-1]
        if "." in real and short == name:
            statement = f"from {real.rsplit('.', 1)[0]} import {short}"
        else:
            statement = f"import {real}" if real == name else f"import {real} as {name}"
        self.capture.imports[name] = statement

    def follow(self, ref: str, scope: Mapping[str, Any], used_by: str) -> None:
        """Capture the global `ref` a definition reads, if the notebook defines it."""
        if ref in scope:
            self.add(ref, scope[ref], scope, used_by)
        # Not in the namespace: a builtin, or a name the code never reaches here. A
        # missing one fails the one-batch check with Python's own NameError.


# What `tf.keras` is in a process running Keras 3, and in one running Keras 2 (tf_keras).
_TF_KERAS = ("keras._tf_keras.keras", "tf_keras.api._v2.keras")


def _by_tensorflow_s_name(name: str) -> str:
    """A module of `tf.keras` (`from tensorflow.keras import backend as K`) by TensorFlow's
    name, `tensorflow.keras...`: imported so in each job process, it is the Keras that
    process runs, which for a Keras-2 job is not the notebook's."""
    for prefix in _TF_KERAS:
        if name == prefix or name.startswith(prefix + "."):
            return "tensorflow.keras" + name[len(prefix) :]
    return name


def _literal(value: Any) -> str | None:
    """`value` as a short Python literal that reads back equal, or None. Constants are
    shipped as source where they can be: readable, and not tied to a Python version."""
    if not isinstance(value, int | float | complex | str | bytes | bool | tuple | list | dict):
        return None
    text = repr(value)
    if len(text) > 2000:
        return None
    try:
        return text if ast.literal_eval(text) == value else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _scope_of(value: Any, namespace: Mapping[str, Any]) -> Mapping[str, Any]:
    """The globals a notebook function or class was defined in."""
    if inspect.isclass(value):
        for member in vars(value).values():
            member = getattr(member, "__func__", member)
            if inspect.isfunction(member):
                return member.__globals__
        return namespace
    return getattr(getattr(value, "python_function", value), "__globals__", namespace)


def _import_of(name: str, value: Any) -> str | None:
    """`from module import thing as name`, if that gives back this very object."""
    module_name = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", "")
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        return None
    if not qualname.isidentifier() or _origin(sys.modules.get(module_name)) != "installed":
        return None
    try:
        if getattr(importlib.import_module(module_name), qualname) is not value:
            return None
    except (ImportError, AttributeError):
        return None
    alias = "" if qualname == name else f" as {name}"
    return f"from {module_name} import {qualname}{alias}"


def collect(entries: Mapping[str, Any], namespace: Mapping[str, Any] | None = None) -> Capture:
    """Capture the contract functions in `entries` ('custom_model', 'loss', ...) and all
    they use. `custom_model` may also be a Keras model object; a compiled one supplies the
    loss and optimizer when `entries` does not."""
    if namespace is None:  # the notebook's (or script's) globals, to name a model object by
        namespace = _notebook_namespace()
    collector = _Collector()
    cap = collector.capture
    for contract_name, value in entries.items():
        if value is None:
            continue
        if contract_name == "custom_model" and keras_models.is_keras_model(value):
            name = _name_in(namespace, value) or "model"
            collector.add(name, value, namespace, "custom_model")
            cap.generated.append(
                f"def custom_model():\n    return load_keras_model(__file__, {name!r}, globals())\n"
            )
            cap.compiled = keras_models.compiled_parts(value)
            continue
        name = contract_name
        if _is_code(value):
            fn_name = getattr(getattr(value, "python_function", value), "__name__", "")
            if fn_name.isidentifier() and namespace.get(fn_name, value) is value:
                name = fn_name  # captured under its own name, as the notebook wrote it
        collector.add(name, value, namespace, contract_name)
        cap.contract[contract_name] = name
    for part, text in (
        ("loss", keras_models.COMPILED_LOSS),
        ("optimizer", keras_models.COMPILED_OPTIMIZER),
    ):
        if part in cap.compiled and entries.get(part) is None:
            cap.generated.append(text)
            cap.imports["_keras"] = keras_models.KERAS_IMPORT
        else:
            cap.compiled.pop(part, None)
    if cap.compiled:
        collector.by_value["__compiled__"] = (cap.compiled, "model.compile")
    return collector.finish()


def _notebook_namespace() -> Mapping[str, Any]:
    shell = None
    if "IPython" in sys.modules:
        from IPython import get_ipython

        shell = get_ipython()
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


def _name_in(namespace: Mapping[str, Any], value: Any) -> str | None:
    for key, bound in namespace.items():
        if bound is value and key.isidentifier() and not key.startswith("_"):
            return key
    return None
