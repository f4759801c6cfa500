"""A compiled step, called without `tf.function`'s per-call argument binding.

Calling a `tf.function` (or its public concrete function) binds and type-checks every
argument in Python: tens of microseconds per tensor argument. A worker's train step and a
PS's step take ~20 tensor arguments each and run once per minibatch, so that binding was
about half of each call in the CTR benchmark (profiles in bench/profiles/). A
`CompiledCall` traces once for a fixed input signature and then passes the flattened
arguments straight to the concrete function's flat entry point, after a cheap check of
dtypes and shapes against the signature (the flat entry point itself checks nothing in
eager mode).

NumPy arguments become tensors through the `EagerTensor` constructor directly (~6 µs
instead of ~18 µs through `tf.convert_to_tensor`, which re-derives what the signature
already fixed).

The flat entry point (`ConcreteFunction._call_flat`) and the `EagerTensor` constructor are
TensorFlow-internal; if a TensorFlow version lacks them, calls fall back to the public
(slower) path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

try:  # TensorFlow-internal, see the module docstring
    from tensorflow.python.eager import context as _context
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - another TensorFlow layout
    _context = _EagerTensor = None


class SignatureMismatch(TypeError):
    """An argument does not fit the signature the step was compiled for."""


class CompiledCall:
    def __init__(self, fn: Callable, signature: list[Any], name: str = "step"):
        """`signature`: the positional arguments as nested structures of `tf.TensorSpec`."""
        self.name = name
        self.signature = signature
        self._concrete = tf.function(fn).get_concrete_function(*signature)
        # Composite arguments (a tf.SparseTensor of features) pass as their component
        # tensors, as the concrete function's flat entry point takes them.
        self._specs = tf.nest.flatten(signature, expand_composites=True)
        self._dims = [tuple(s.shape.as_list()) for s in self._specs]
        self._fast = hasattr(self._concrete, "_call_flat") and _EagerTensor is not None
        self._enums = [s.dtype.as_datatype_enum for s in self._specs]

    def __call__(self, *args: Any) -> Any:
        flat = tf.nest.flatten(args, expand_composites=True)
        if len(flat) != len(self._specs):
            raise SignatureMismatch(
                f"{self.name}: {len(flat)} tensors given, compiled for {len(self._specs)}"
            )
        if not self._fast:
            tensors = [self._tensor(i, x, None) for i, x in enumerate(flat)]
            packed = tf.nest.pack_sequence_as(self.signature, tensors, expand_composites=True)
            return self._concrete(*packed)
        device = _context.context().device_name
        tensors = [self._tensor(i, x, device) for i, x in enumerate(flat)]
        return self._concrete._call_flat(tensors, self._concrete.captured_inputs)

    def _tensor(self, index: int, value: Any, device: str | None) -> tf.Tensor:
        spec = self._specs[index]
        if isinstance(value, np.ndarray) and spec.dtype == tf.string:  # (numpy: U, S or O)
            tensor = tf.convert_to_tensor(value, dtype=tf.string)
            self._check_shape(index, tuple(tensor.shape.as_list()))
            return tensor
        if isinstance(value, np.ndarray):
            if value.dtype != spec.dtype.as_numpy_dtype:
                raise SignatureMismatch(
                    f"{self.name}: argument {index} is {value.dtype}, compiled for "
                    f"{spec.dtype.name}"
                )
            self._check_shape(index, value.shape)
            if device is not None:
                return _EagerTensor(value, device, self._enums[index])
            return tf.convert_to_tensor(value, dtype=spec.dtype)
        tensor = tf.convert_to_tensor(value, dtype=spec.dtype)
        self._check_shape(index, tuple(tensor.shape.as_list()))
        return tensor

    def _check_shape(self, index: int, shape: tuple) -> None:
        dims = self._dims[index]
        if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
            raise SignatureMismatch(
                f"{self.name}: argument {index} has shape {shape}, compiled for {list(dims)}"
            )
