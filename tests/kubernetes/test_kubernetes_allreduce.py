"""The allreduce strategy on the real node: worker pods (containers of the job image)
that reduce among themselves (no PS pod), a worker pod deleted mid-run while the other
pods carry on, and its replacement pod joining the group."""

from __future__ import annotations

import pytest

import elasticdl_nb as edl
from elasticdl_nb.runtime.worker.replica_records import read_checksums, replica_problems
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split, paced_loss
from tests.kubernetes.job_pods import k8s_options, pods, running_pod

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


def test_worker_pods_train_in_a_ring_and_survive_a_deleted_pod_in_place(
    job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("kubernetes-allreduce")
    epochs = 25
    (x, y), (xt, yt) = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": paced_loss},
        data=(x, y),
        validation_data=(xt, yt),
        workers=3,
        strategy="allreduce",
        epochs=epochs,
        minibatch_size=32,
        record_ledger=True,
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )
    at = rng.randint(20, 150)  # minibatches; a step holds three
    wait_for_step(job, at, timeout=300)
    assert not pods(core, job_namespace, "ps")  # the allreduce strategy runs no PS
    victim = wait_for(lambda: running_pod(core, job_namespace, "worker"), 60, "a worker pod")
    before = {name for name, p in pods(core, job_namespace, "worker").items()}
    core.delete_namespaced_pod(victim, job_namespace)
    print(f"deleted {victim} at minibatch {at}")

    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final
    assert final["metrics"]["accuracy"] >= 0.85
    events = list(job.events(follow=False))
    groups = [e.data for e in events if e.kind == "group"]
    failure = next(g for g in groups if g["reason"] == "failure")
    victim_id = int(victim.rsplit("-", 1)[1])
    assert failure["left"] == [victim_id]
    relaunched = next(e.data["id"] for e in events if e.kind == "relaunch")
    assert any(g["reason"] == "joined" and g["joined"] == [relaunched] for g in groups)
    # The other pods never restarted: each replica's process entered and ended the same.
    records = read_checksums(job.dir)
    survivors = set(failure["members"])
    for worker in survivors:
        assert {r["pid"] for r in records if r["worker"] == worker} != set()
        assert len({r["pid"] for r in records if r["worker"] == worker}) == 1
    assert {f"{job.name}-worker-{w}" for w in survivors} <= before
    assert replica_problems(job.dir, [len(x)], 32, epochs) == []
