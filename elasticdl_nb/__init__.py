"""elasticdl-nb: train a Keras model as an elastic, fault-tolerant parameter-server job.

    import elasticdl_nb as edl
    job = edl.train(custom_model, loss=loss, optimizer=optimizer, data=(x, y), workers=2)
    job.wait(); model = job.model()

Importing this package imports neither TensorFlow nor gRPC: the names below are loaded
when first used, so a process that only runs a small part of the package (a local job's
supervisor, `backends/local/supervisor.py`) stays small and forks cheaply.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from elasticdl_nb import elasticdl_imports

elasticdl_imports.install()  # ElasticDL's model-zoo imports work wherever this package does

if TYPE_CHECKING:
    from elasticdl_nb.errors import ElasticDLError
    from elasticdl_nb.model.contract import Mode
    from elasticdl_nb.sdk import Job, JobFailed, attach, jobs, train
    from elasticdl_nb.sdk.embeddings import load_embeddings
    from elasticdl_nb.sdk.errors import (
        IdleWorkersWarning,
        JobNotFound,
        JobNotRunning,
        NoModelYet,
        NoPredictionsYet,
        NoSuchLog,
        ScaleRefused,
        UnknownRole,
    )
    from elasticdl_nb.spec import JobSpec, SpecError

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "ElasticDLError": "elasticdl_nb.errors",
    "Mode": "elasticdl_nb.model.contract",
    **dict.fromkeys(["Job", "JobFailed", "attach", "jobs", "train"], "elasticdl_nb.sdk"),
    **dict.fromkeys(
        [
            "IdleWorkersWarning",
            "JobNotFound",
            "JobNotRunning",
            "NoModelYet",
            "NoPredictionsYet",
            "NoSuchLog",
            "ScaleRefused",
            "UnknownRole",
        ],
        "elasticdl_nb.sdk.errors",
    ),
    **dict.fromkeys(["JobSpec", "SpecError"], "elasticdl_nb.spec"),
    "load_embeddings": "elasticdl_nb.sdk.embeddings",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'elasticdl_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


def load_ipython_extension(ipython) -> None:
    """`%load_ext elasticdl_nb`: the `%elasticdl` magics (see elasticdl_nb/magics/)."""
    from elasticdl_nb.magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "ElasticDLError",
    "IdleWorkersWarning",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobNotRunning",
    "JobSpec",
    "Mode",
    "NoModelYet",
    "NoPredictionsYet",
    "NoSuchLog",
    "ScaleRefused",
    "SpecError",
    "UnknownRole",
    "attach",
    "jobs",
    "load_embeddings",
    "train",
]
