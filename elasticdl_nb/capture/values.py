"""Notebook values that travel by value, and the ones that cannot.

A value (a vocabulary dict, a constant array, a lambda) is pickled with cloudpickle. Some
objects only make sense in the process that made them — an open file, a lock, a generator
half-way through, a tensor on this machine's GPU — and pickling them either fails with a
message that does not say which variable was at fault, or worse, succeeds with something
useless. Those are refused up front, by name.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import threading
import types
from typing import Any

from elasticdl_nb.errors import ElasticDLError


class CaptureError(ElasticDLError, ValueError):
    """Something the model uses cannot be shipped to the job; the message names it."""


_LOCAL_ONLY: list[tuple[type | tuple[type, ...], str, str]] = [
    (io.IOBase, "an open file", "open it inside the function that reads it"),
    (socket.socket, "a network socket", "connect inside the function that uses it"),
    (
        (type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event),
        "a lock or other thread synchronisation object",
        "create it inside the function that uses it",
    ),
    (threading.Thread, "a thread", "start it inside the function that needs it"),
    (subprocess.Popen, "a running process", "start it inside the function that needs it"),
    (
        (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType),
        "a generator (it cannot be copied half-way through)",
        "turn it into a list, or write a function that creates it",
    ),
]


def refuse_local_only(name: str, value: Any, used_by: str) -> None:
    """Raise CaptureError if `value` is one of the objects that only live in this process."""
    for kinds, what, fix in _LOCAL_ONLY:
        if isinstance(value, kinds):
            raise CaptureError(_message(name, used_by, f"is {what}", fix))
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        if isinstance(value, tf.data.Dataset):
            raise CaptureError(
                _message(
                    name,
                    used_by,
                    "is a tf.data.Dataset, which cannot be copied to another process",
                    "pass the data with --data and shape it in feed()",
                )
            )
        if isinstance(value, tf.Tensor | tf.Variable) and "GPU" in (value.device or ""):
            raise CaptureError(
                _message(
                    name,
                    used_by,
                    f"is a tensor on {value.device}",
                    f"capture a copy in host memory: {name} = {name}.numpy()",
                )
            )


def pickled(name: str, value: Any, used_by: str) -> bytes:
    """`value` pickled by value, or CaptureError naming the variable."""
    import cloudpickle

    refuse_local_only(name, value, used_by)
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # any pickling failure becomes a message naming the variable
        raise CaptureError(
            _message(
                name,
                used_by,
                f"({type(value).__name__}) cannot be pickled: {exc}",
                "create it inside the function that uses it, or capture plain data instead",
            )
        ) from exc


def _message(name: str, used_by: str, problem: str, fix: str) -> str:
    return f"Cannot capture {name!r} (used by {used_by}): it {problem}. Fix: {fix}."
