"""Point-to-point handoff between members: arrays of any dtype and shape arrive bit for
bit; a handoff nobody sends ends in PeerLost at the deadline, not a hang."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from elasticdl_nb.runtime.collective import PeerLost, RingListener
from elasticdl_nb.runtime.collective.handoff import receive_arrays, send_arrays

TOKEN = "handoff-token"


def test_arrays_arrive_bit_for_bit():
    rng = np.random.default_rng(1)
    arrays = [
        rng.standard_normal((300, 70)).astype(np.float32),
        np.array([np.nan, -0.0, np.inf], np.float64),  # bits that arithmetic would change
        np.arange(10, dtype=np.int64).reshape(2, 5),
        np.zeros((0, 3), np.float16),
        np.float32(7.5) * np.ones(()),
    ]
    receiver = RingListener("127.0.0.1", TOKEN, 1)
    sender = threading.Thread(
        target=send_arrays, args=(receiver.address, TOKEN, 4, 0, 1, arrays, 10)
    )
    sender.start()
    received = receive_arrays(receiver, version=4, source=0, timeout=10)
    sender.join(10)
    receiver.close()
    assert len(received) == len(arrays)
    for got, sent in zip(received, arrays, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert got.tobytes() == sent.tobytes()


def test_a_handoff_that_never_comes_ends_at_the_deadline():
    receiver = RingListener("127.0.0.1", TOKEN, 0)
    with pytest.raises(PeerLost, match="did not connect within 0.3 s"):
        receive_arrays(receiver, version=1, source=5, timeout=0.3)
    receiver.close()
