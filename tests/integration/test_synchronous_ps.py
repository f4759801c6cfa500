"""Synchronous PS training (`grads_to_wait`, ElasticDL's semantics) in real jobs."""

from __future__ import annotations

import numpy as np
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
    # The final evaluation is of the model the job exported: every worker evaluates on
    # the newest version (one whose push completed a version used to hold the one before).
    exported = accuracy(sync.model(), xt, yt)
    assert sync_status["metrics"]["accuracy"] == pytest.approx(exported, abs=1e-6)
    # Compared over the last quarter of the updates (an evaluation every epoch): a single
    # evaluation moves by +-0.01 from one epoch to the next, which one run against another
    # cannot tell from a difference in training.
    sync_late = late_accuracy(events, quarter_of=2 * EPOCHS)
    reference_late = late_accuracy(reference.events(follow=False), quarter_of=EPOCHS)
    print(f"accuracy, last quarter: synchronous {sync_late:.4f}, asynchronous {reference_late:.4f}")
    assert sync_late >= reference_late - 0.01
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


def late_accuracy(events, quarter_of: int) -> float:
    """The mean accuracy of the evaluations in the last quarter of `quarter_of` epochs."""
    accuracies = [e.data["metrics"]["accuracy"] for e in events if e.kind == "evaluation"]
    assert len(accuracies) == quarter_of  # one evaluation an epoch
    return float(np.mean(accuracies[-quarter_of // 4 :]))


def test_one_worker_computes_each_gradient_on_the_version_its_push_completed(job_home):
    # One worker fills every version itself: its second push of a version completes it,
    # and its next gradient must be computed on that version, whose values came back in
    # the push's reply. A worker that kept computing on the values of its last pull
    # (what it did before) trained on its first pull's parameters for the whole job and
    # stayed at chance (0.10), while the PS drifted off on gradients of the start point.
    job, (x, _), (xt, yt) = digits_job(workers=1, epochs=5, minibatches_per_task=8, grads_to_wait=2)
    status = job.wait(timeout=300)
    assert status["state"] == "succeeded"
    exported = accuracy(job.model(), xt, yt)
    evaluated = status["metrics"]["accuracy"]
    print(f"accuracy: exported {exported:.4f}, final evaluation {evaluated:.4f}")
    assert exported >= 0.85
    # The final evaluation is of the model the job exported (the worker's own values are
    # the newest version's, not one version behind).
    assert evaluated == pytest.approx(exported, abs=1e-6)
    events = list(job.events(follow=False))
    [final] = [e.data for e in events if e.kind == "checkpoint" and e.data["final"]]
    # 44 minibatches an epoch, in pairs: no partial version to flush, nothing stale.
    assert final["versions"][0] == 5 * -(-len(x) // 32) // 2
    assert sum(e.data.get("stale", 0) for e in events if e.kind == "worker_time") == 0
