"""ElasticDL's import paths, for model-zoo files and notebook cells written for ElasticDL:
`from elasticdl.python.elasticdl.layers.embedding import Embedding`, `from
elasticdl.python.common.constants import Mode`, `from elasticdl.python.elasticdl.callbacks
import LearningRateScheduler`, `from elasticdl.python.worker.prediction_outputs_processor
import BasePredictionOutputsProcessor` work wherever `elasticdl_nb` is imported (a
notebook after `import elasticdl_nb` or `%load_ext elasticdl_nb`, and every process of a
job), without ElasticDL installed. They name our own `Embedding`, `Mode`, callbacks and
prediction processor base.

A finder on `sys.meta_path`, the import system's own hook for modules that are not
files: it is asked last, so an installed ElasticDL is found first and wins, and it makes
a module only when one is imported (nothing is written into `sys.modules` beforehand).
An ElasticDL module it does not provide fails with a message that lists the ones it does.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# ElasticDL's module -> (our module, the names it takes from it); () for a package.
PROVIDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "elasticdl": ("", ()),
    "elasticdl.python": ("", ()),
    "elasticdl.python.common": ("", ()),
    "elasticdl.python.common.constants": ("elasticdl_nb.model.contract", ("Mode",)),
    "elasticdl.python.elasticdl": ("", ()),
    "elasticdl.python.elasticdl.layers": ("", ()),
    "elasticdl.python.elasticdl.layers.embedding": ("elasticdl_nb.layers", ("Embedding",)),
    "elasticdl.python.worker": ("", ()),
    "elasticdl.python.worker.prediction_outputs_processor": (
        "elasticdl_nb.model.contract",
        ("BasePredictionOutputsProcessor",),
    ),
    "elasticdl.python.elasticdl.callbacks": (
        "elasticdl_nb.callbacks",
        ("LearningRateScheduler", "MaxStepsStopping", "SavedModelExporter"),
    ),
}


class ElasticDLPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and makes the modules of `PROVIDED`."""

    def find_spec(self, fullname: str, path=None, target=None):
        top = fullname.split(".")[0]
        if top != "elasticdl":
            return None
        installed = sys.modules.get(top)
        if installed is not None and not isinstance(installed.__loader__, ElasticDLPaths):
            return None  # a real ElasticDL's module: its own finder answers for it
        if fullname not in PROVIDED:
            modules = ", ".join(name for name, (_, names) in PROVIDED.items() if names)
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: ElasticDL is not installed, and elasticdl-nb "
                f"provides only what a model-zoo file imports from it ({modules}). Import "
                "the rest from elasticdl_nb, or install ElasticDL.",
                name=fullname,
            )
        is_package = not PROVIDED[fullname][1]
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        source, names = PROVIDED[module.__name__]
        if not names:
            module.__path__ = []  # a package: its children come from this finder too
            return
        ours = importlib.import_module(source)
        for name in names:
            setattr(module, name, getattr(ours, name))


def install() -> None:
    """Put the finder at the end of `sys.meta_path`, once per process."""
    if not any(isinstance(finder, ElasticDLPaths) for finder in sys.meta_path):
        sys.meta_path.append(ElasticDLPaths())
