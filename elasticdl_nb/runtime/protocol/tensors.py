"""NumPy arrays on the wire: raw bytes + dtype + shape, never pickles.

On the bulk channel (`bulk.py`) a large tensor's bytes do not go into the message at all:
`to_tensor` appends the array to an out-of-band list and marks the Tensor with its
position, and `to_array` takes the received buffers to find them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb

# Tensors smaller than this stay inline even on the bulk channel: a copy is cheaper there
# than one more buffer in the frame.
OUT_OF_BAND_MIN_BYTES = 64 * 1024


def to_tensor(
    array: np.ndarray, out: pb.Tensor | None = None, out_of_band: list[np.ndarray] | None = None
) -> pb.Tensor:
    """Encode `array` (C order) into `out` (or a new Tensor). With an `out_of_band` list, a
    large array is appended to it (not copied) instead of being put into the message."""
    array = np.asarray(array, order="C")  # (ascontiguousarray would turn a scalar 1-d)
    if array.dtype.hasobject:
        raise TypeError(f"cannot send an object array of shape {array.shape} as a tensor")
    msg = pb.Tensor() if out is None else out
    msg.dtype = array.dtype.str
    msg.shape[:] = array.shape
    if out_of_band is not None and array.nbytes >= OUT_OF_BAND_MIN_BYTES:
        out_of_band.append(array)
        msg.out_of_band = len(out_of_band)
    else:
        msg.data = array.tobytes()
    return msg


def to_array(msg: pb.Tensor, buffers: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Decode a Tensor; the result is read-only and shares the message's bytes (or, for an
    out-of-band tensor, those of its buffer in `buffers`)."""
    dtype, shape = np.dtype(msg.dtype), tuple(msg.shape)
    if not msg.out_of_band:
        return np.frombuffer(msg.data, dtype=dtype).reshape(shape)
    if msg.out_of_band > len(buffers):
        raise ValueError(f"tensor refers to buffer {msg.out_of_band} of {len(buffers)}")
    array = np.frombuffer(buffers[msg.out_of_band - 1], dtype=dtype).reshape(shape)
    array.flags.writeable = False
    return array


def as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous `array`, without a copy (for `socket.sendall`)."""
    return memoryview(array.reshape(-1).view(np.uint8))
