"""NumPy arrays on the wire: raw bytes + dtype + shape, never pickles."""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb


def to_tensor(array: np.ndarray, out: pb.Tensor | None = None) -> pb.Tensor:
    """Encode `array` (C order) into `out` (or a new Tensor)."""
    array = np.asarray(array, order="C")  # (ascontiguousarray would turn a scalar 1-d)
    if array.dtype.hasobject:
        raise TypeError(f"cannot send an object array of shape {array.shape} as a tensor")
    msg = pb.Tensor() if out is None else out
    msg.dtype = array.dtype.str
    msg.shape[:] = array.shape
    msg.data = array.tobytes()
    return msg


def to_array(msg: pb.Tensor) -> np.ndarray:
    """Decode a Tensor; the result is read-only and shares the message's bytes."""
    return np.frombuffer(msg.data, dtype=np.dtype(msg.dtype)).reshape(tuple(msg.shape))
