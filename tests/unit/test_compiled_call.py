"""CompiledCall: the fast path gives what the function gives, and refuses misfits."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from elasticdl_nb.runtime.compiled_call import CompiledCall, SignatureMismatch


def _fn(features, weights, ids):
    # Dict features flatten in sorted-key order; a mix-up of "a" and "b" would show.
    out = features["b"] * 10.0 - features["a"] + tf.reduce_sum(weights[0]) + weights[1]
    return {"out": out, "ids": tf.unique(ids)[0]}, [tf.shape(ids)[0]]


SIGNATURE = [
    {"a": tf.TensorSpec([None], tf.float32), "b": tf.TensorSpec([None], tf.float32)},
    [tf.TensorSpec([2, 2], tf.float32), tf.TensorSpec([], tf.float32)],
    tf.TensorSpec([None], tf.int64),
]


def _args(n):
    rng = np.random.default_rng(n)
    features = {
        "b": rng.normal(size=n).astype(np.float32),
        "a": rng.normal(size=n).astype(np.float32),
    }
    weights = [rng.normal(size=(2, 2)).astype(np.float32), np.float32(rng.normal())]
    return features, weights, rng.integers(0, 5, size=n).astype(np.int64)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_fast_call_matches_the_function_for_any_batch_size(n):
    call = CompiledCall(_fn, SIGNATURE, "test step")
    got = call(*_args(n))
    want = tf.function(_fn)(*_args(n))
    np.testing.assert_allclose(got[0]["out"].numpy(), want[0]["out"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got[0]["ids"].numpy(), want[0]["ids"].numpy())
    assert int(got[1][0]) == n


def test_non_contiguous_arrays_are_read_correctly():
    call = CompiledCall(_fn, SIGNATURE, "test step")
    features, weights, ids = _args(6)
    wide = np.arange(16, dtype=np.float32).reshape(4, 4)
    strided = [wide[::2, ::2], weights[1]]  # a view: not C-contiguous
    assert not strided[0].flags.c_contiguous
    got = call(features, strided, ids)
    want = tf.function(_fn)(features, [np.ascontiguousarray(strided[0]), weights[1]], ids)
    np.testing.assert_allclose(got[0]["out"].numpy(), want[0]["out"].numpy(), rtol=1e-6)


def test_fallback_without_the_flat_entry_point_gives_the_same():
    call = CompiledCall(_fn, SIGNATURE, "test step")
    fast = call(*_args(9))
    call._fast = False
    slow = call(*_args(9))
    np.testing.assert_allclose(fast[0]["out"].numpy(), slow[0]["out"].numpy(), rtol=1e-6)


def test_misfits_are_refused_with_the_argument_named():
    call = CompiledCall(_fn, SIGNATURE, "test step")
    features, weights, ids = _args(4)
    with pytest.raises(SignatureMismatch, match="argument 2 has shape \\(3, 2\\)"):
        call(features, [np.zeros((3, 2), np.float32), weights[1]], ids)
    with pytest.raises(SignatureMismatch, match="int32, compiled for int64"):
        call(features, weights, ids.astype(np.int32))
    with pytest.raises(SignatureMismatch, match="4 tensors given, compiled for 5"):
        call(features, weights[:1], ids)
