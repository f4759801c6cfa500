"""The training rate of the last 10 seconds (runtime/master/progress.py) keeps its sum as
entries come and go: after every change it equals a sum over the window taken anew."""

from __future__ import annotations

import random
from unittest import mock

from elasticdl_nb.runtime.master import progress


class _Queue:
    train: list = []
    done_count = 0

    def records_done(self, epoch: int) -> int:
        return 0


def test_the_kept_sum_is_the_window_s_sum_after_every_change():
    clock = [0.0]
    rng = random.Random(39)
    with mock.patch.object(progress.time, "monotonic", lambda: clock[0]):
        tracked = progress.Progress(_Queue(), epochs=1, minibatch_size=10)
        for _ in range(20_000):
            clock[0] += rng.random() * 0.3  # (entries 0.15 s apart: ~70 in a window)
            if rng.random() < 0.7:
                tracked.applied(rng.randint(1, 5))
            if rng.random() < 0.3:
                rate = tracked.fields(0)["records_per_second"]
                window = list(tracked._window)
                span = clock[0] - window[0][0] if len(window) > 1 else 0
                taken = sum(n for _, n in window[1:]) / span if span > 0 else 0.0
                assert rate == round(taken, 1)
