"""The PS's side of a 64 MiB push, stage by stage, with no transport (a profile, not a
benchmark: it prints a table and writes no result; bench/profiles.md, section 4).

    .venv/bin/python bench/profile_push.py [--mib 64]

A push to the PS is the bytes on the wire and then the update, in series
(`bench/transfer.py`). This takes the update apart, in one process pinned like a PS
(bench/harness.py) and keeping freed memory as a PS does (runtime/heap.py): the memory's
own speed (a copy), turning the received array into a tensor, Keras's SGD update in plain
TensorFlow ops and fused, and the PS's own path: the step's call given the array as the
bulk channel receives it (64-byte aligned, so TensorFlow aliases it rather than copying)
and the dense update the PS compiles (runtime/ps/dense_update.py, XLA at this size).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import harness

harness.pin_threads()
from elasticdl_nb.runtime.heap import keep_freed_memory  # noqa: E402

keep_freed_memory()
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticdl_nb.runtime.compiled_call import CompiledCall  # noqa: E402
from elasticdl_nb.runtime.protocol.frames import aligned_buffer  # noqa: E402
from elasticdl_nb.runtime.ps.dense_update import DenseUpdate  # noqa: E402


def median_ms(call: Callable[[], object], reps: int = 8) -> float:
    """The median milliseconds of `call`, after two warm-up calls (tracing, first touch)."""
    call(), call()
    laps = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        laps.append(time.perf_counter() - start)
    return statistics.median(laps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="size of the pushed variable")
    n = parser.parse_args().mib * 2**20 // 4
    unaligned = np.random.default_rng(0).random(n + 1, np.float32)[1:]  # (4 bytes in)
    received = aligned_buffer(4 * n).view(np.float32)  # as the bulk channel leaves it
    received[:] = unaligned
    grad = tf.constant(received)
    var = tf.Variable(np.zeros(n, np.float32))
    sgd = keras.optimizers.SGD(0.01)
    sgd.build([var])

    def fused(g: tf.Tensor) -> None:
        tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=tf.constant(0.01), delta=g)

    keras_step = tf.function(lambda g: sgd.apply_gradients([(g, var)]))
    keras_xla = tf.function(lambda g: sgd.apply_gradients([(g, var)]), jit_compile=True)
    spec = [tf.TensorSpec([n], tf.float32)]
    keras_call = CompiledCall(lambda g: sgd.apply_gradients([(g, var)]), spec, "plain")
    update = DenseUpdate(sgd, [var])
    ps_call = CompiledCall(lambda g: update([g]), spec, "PS")
    out = np.empty_like(received)
    stages = {
        "np.copyto (the memory's speed)": lambda: np.copyto(out, received),
        "tf.convert_to_tensor of the received array": lambda: tf.convert_to_tensor(received),
        "Keras SGD, the PS step's call, given an unaligned array": lambda: keras_call(unaligned),
        "the same, given the aligned array the bulk channel receives": lambda: keras_call(received),
        f"the PS's dense update (fused: {update.fused}), given the aligned array": lambda: ps_call(
            received
        ),
        "Keras SGD.apply_gradients, compiled, given the array": lambda: keras_step(received),
        "the same, given a tensor": lambda: keras_step(grad),
        "the same with jit_compile=True": lambda: keras_xla(grad),
        "ResourceApplyGradientDescent (one fused op)": tf.function(lambda: fused(grad)),
        "v.assign_sub(lr * g)": tf.function(lambda: var.assign_sub(0.01 * grad)),
    }
    print(f"| stage, {n * 4 / 2**20:.0f} MiB of float32 | ms |\n|---|---:|")
    for name, call in stages.items():
        print(f"| {name} | {median_ms(call):.1f} |")


if __name__ == "__main__":
    main()
