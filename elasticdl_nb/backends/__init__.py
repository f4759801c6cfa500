"""Backends: the hands that start, stop and watch a job's processes.

They hold no policy. A backend (`backend.Backend`) submits a job's master and finds jobs
again for clients; in the master, its site launches and kills workers and parameter
servers and reports what happened to them in the runtime's shape
(`runtime.master.site`). The elastic policy over those events lives in the master
(`runtime.master.instances`).

`get_backend(name)` is the one lookup by name. A backend's module is imported when it
is first asked for, so a local job never imports the Kubernetes client; nor does this
package import its interfaces (`backend.py`, which names gRPC types) until they are used,
so a local job's supervisor, which lives in here, imports neither gRPC nor TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elasticdl_nb.backends.backend import Backend, FoundJob, MasterLink

# name -> "module:class"
_REGISTRY = {
    "local": "elasticdl_nb.backends.local.backend:LocalBackend",
    "kubernetes": "elasticdl_nb.backends.kubernetes.backend:KubernetesBackend",
}
_made: dict[str, Backend] = {}


def backend_names() -> list[str]:
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The backend called `name` ('local', 'kubernetes')."""
    if name not in _made:
        if name not in _REGISTRY:
            from elasticdl_nb.spec import SpecError

            raise SpecError(
                f"Unknown backend {name!r}: use one of {', '.join(map(repr, _REGISTRY))}."
            )
        module, _, cls = _REGISTRY[name].partition(":")
        _made[name] = getattr(importlib.import_module(module), cls)()
    return _made[name]


def __getattr__(name: str):
    if name in ("Backend", "FoundJob", "MasterLink"):
        return getattr(importlib.import_module("elasticdl_nb.backends.backend"), name)
    raise AttributeError(f"module 'elasticdl_nb.backends' has no attribute {name!r}")


__all__ = ["Backend", "FoundJob", "MasterLink", "backend_names", "get_backend"]
