"""Synchronous PS training (`grads_to_wait`, ElasticDL's semantics) in real jobs."""

from __future__ import annotations

import pytest

from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.models import accuracy, digits_job

pytestmark = pytest.mark.slow

EPOCHS = 20  # the asynchronous run's; the synchronous one makes as many updates


def test_synchronous_ps_averages_grads_to_wait_gradients_per_version_and_learns_as_async(
    job_home,
):
    # With grads_to_wait=2 a version averages two minibatches, so over the same data it
    # makes half as many updates: compared at equal updates (twice the epochs).
    sync, (x, _), (xt, yt) = digits_job(
        workers=2, epochs=2 * EPOCHS, minibatches_per_task=8, grads_to_wait=2
    )
    sync_status = sync.wait(timeout=400)
    events = list(sync.events(follow=False))
    reference, _, _ = digits_job(workers=2, epochs=EPOCHS, minibatches_per_task=8)
    reference_status = reference.wait(timeout=400)

    assert sync_status["state"] == reference_status["state"] == "succeeded"
    sync_accuracy = accuracy(sync.model(), xt, yt)
    reference_accuracy = reference_status["metrics"]["accuracy"]
    print(f"accuracy: synchronous {sync_accuracy:.4f}, asynchronous {reference_accuracy:.4f}")
    assert sync_accuracy >= reference_accuracy - 0.01
    assert ledger_problems(sync.dir, 1, [len(x)], epochs=2 * EPOCHS) == []

    # One version per two minibatches (and, at most, one partial version per epoch
    # flushed at its end).
    minibatches = 2 * EPOCHS * -(-len(x) // 32)
    [final] = [e.data for e in events if e.kind == "checkpoint" and e.data["final"]]
    assert minibatches // 2 <= final["versions"][0] <= minibatches // 2 + 2 * EPOCHS
    # Both workers pushed on versions the other had moved past: refused, done again.
    timings = [e.data for e in events if e.kind == "worker_time"]
    computed = sum(t["minibatches"] for t in timings)
    stale = sum(t.get("stale", 0) for t in timings)
    print(f"{stale} of {computed} minibatch computations refused as stale")
    assert stale > 0 and computed == minibatches + stale
