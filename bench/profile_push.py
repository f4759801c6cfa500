"""The PS's side of a 64 MiB push, stage by stage, with no transport (a profile, not a
benchmark: it prints a table and writes no result; bench/profiles.md, section 4).

    .venv/bin/python bench/profile_push.py [--mib 64]

A push to the PS is the bytes on the wire and then the update, in series
(`bench/transfer.py`). This takes the update apart, in one process pinned like a PS
(bench/harness.py) and keeping freed memory as a PS does (runtime/heap.py): the memory's
own speed (a copy), turning the received array into a tensor, Keras's SGD update as the
PS's compiled step makes it, and two fused forms of the same update.
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
    received = np.random.default_rng(0).random(n, np.float32)  # as the bulk channel leaves it
    grad = tf.constant(received)
    var = tf.Variable(np.zeros(n, np.float32))
    sgd = keras.optimizers.SGD(0.01)
    sgd.build([var])

    def fused(g: tf.Tensor) -> None:
        tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=tf.constant(0.01), delta=g)

    keras_step = tf.function(lambda g: sgd.apply_gradients([(g, var)]))
    keras_xla = tf.function(lambda g: sgd.apply_gradients([(g, var)]), jit_compile=True)
    out = np.empty_like(received)
    stages = {
        "np.copyto (the memory's speed)": lambda: np.copyto(out, received),
        "tf.convert_to_tensor of the received array": lambda: tf.convert_to_tensor(received),
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
