"""The dense part of a PS step: a Keras optimizer applying one gradient per dense variable,
compiled by XLA when the variables are large.

Keras's optimizers update a variable in several TensorFlow ops (SGD: multiply, then
subtract; Adam: about ten), each one pass over the variable's memory with a temporary of
its size in between. XLA fuses them into one pass: on a 64 MiB variable SGD's update went
from ~15 to ~7 ms and Adam's several times faster (`bench/profile_push.py`), and that
update is half of a large push. For small variables XLA's launch costs more than it saves
(SGD on the CTR model's six dense variables: ~0.8 against ~0.5 ms), so they keep the plain
ops. The fused update may differ from the plain one in the last bit (XLA contracts a
multiply and an add into one rounding).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import tensorflow as tf

log = logging.getLogger("elasticdl_nb.ps")

# Dense variables of a shard at least this large together are updated by XLA.
XLA_MIN_DENSE_BYTES = 1 << 20


class DenseUpdate:
    """Applies one gradient per variable (in order) with `optimizer`, inside the PS's
    compiled step; `fused` says whether XLA compiles it."""

    def __init__(self, optimizer, variables: Sequence[tf.Variable]):
        self._optimizer, self._variables = optimizer, list(variables)
        self.fused = False
        self._apply: Callable[[Sequence[tf.Tensor]], None] = self._plain
        size = sum(v.shape.num_elements() * v.dtype.size for v in self._variables)
        if size < XLA_MIN_DENSE_BYTES:
            return
        # (one argument per gradient: the lowering below takes no nested arguments)
        fused = tf.function(lambda *grads: self._plain(grads), jit_compile=True)
        specs = [tf.TensorSpec(v.shape, v.dtype) for v in self._variables]
        try:  # lowered now (not run): an optimizer XLA cannot compile keeps the plain ops
            fused.experimental_get_compiler_ir(*specs)(stage="hlo")
        except Exception as err:  # (TensorFlow raises several kinds for an unsupported op)
            log.info("dense update left to plain TensorFlow ops: XLA cannot compile it: %s", err)
            return
        self._apply, self.fused = lambda grads: fused(*grads), True

    def __call__(self, grads: Sequence[tf.Tensor]) -> None:
        self._apply(grads)

    def _plain(self, grads: Sequence[tf.Tensor]) -> None:
        self._optimizer.apply_gradients(list(zip(grads, self._variables)))
