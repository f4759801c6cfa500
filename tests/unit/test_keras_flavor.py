"""Which Keras a process runs and what tells a job's processes (keras_flavor.py): the
helpers that read an optimizer's and a variable's state the same way in both."""

from __future__ import annotations

import os
import subprocess
import sys

import keras

from elasticdl_nb.keras_flavor import (
    LEGACY_ENV,
    VERSION,
    environ_for,
    optimizer_variables,
    variable_name,
)


def test_a_job_s_environment_says_keras_2_and_nothing_for_keras_3():
    assert environ_for("2") == {LEGACY_ENV: "1"} and environ_for("3") == {}
    assert VERSION == "3"  # (the test session runs Keras 3)


def test_optimizer_state_and_names_read_alike_in_both_kerases():
    dense = keras.layers.Dense(2, name="d")
    dense.build((None, 3))
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(dense.trainable_variables)
    assert len(optimizer_variables(optimizer)) == 2 + 2 * 2  # (iterations, rate; m and v)
    assert variable_name(dense.kernel) == "d/kernel"  # (tf_keras: its name, "kernel")
    code = (
        "import tensorflow as tf; from elasticdl_nb.keras_flavor import *;"
        "d = tf.keras.layers.Dense(2, name='d'); d.build((None, 3));"
        "o = tf.keras.optimizers.Adam(0.1); o.build(d.trainable_variables);"
        "print(VERSION, len(optimizer_variables(o)), variable_name(d.kernel))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **environ_for("2"), "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split() == ["2", "5", "kernel"], out.stderr[-2000:]
