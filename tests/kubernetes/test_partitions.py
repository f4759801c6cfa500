"""Network faults between a job's pods on the real node (iptables in the pods' network
namespaces, net_faults.py): a worker cut off from its PS, the PS cut off from everyone, a
lossy PS and connection resets on its bulk channel, an allreduce member cut off from its
successor in the ring. The job goes on through each, nothing hangs, every record is
applied exactly once (the PS ledger, the replicas' ledgers), and the journal says who
could not reach whom, and for how long (`peer_unreachable`; the ring: `group` causes).

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_partitions.py
"""

from __future__ import annotations

import time

import pytest

import elasticdl_nb as edl
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split
from tests.kubernetes.job_pods import close_forward, k8s_options, pods
from tests.kubernetes.net_faults import PodNetwork
from tests.kubernetes.test_kubernetes_jobs import _paced_loss

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

CUT_SECONDS = 15  # (TCP retransmits into a heal ~25 s after a 15 s cut began)


def _train(real_cluster, namespace: str, tmp_path, epochs: int):
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=2,
        epochs=epochs,
        minibatch_size=32,
        checkpoint_steps=40,
        record_ledger=True,
        **k8s_options(real_cluster, namespace, tmp_path),
    )
    return job, len(x)


def _pod(core, namespace: str, role: str, index: int = 0) -> str:
    (name,) = [
        n for n, p in pods(core, namespace).items()
        if p.metadata.labels["elasticdl-nb/role"] == role
        and int(p.metadata.labels.get("elasticdl-nb/index", 0)) == index
        and not p.metadata.deletion_timestamp
    ]  # fmt: skip
    return name


def _running_pod(core, namespace: str, role: str) -> str:
    """The job's pod of `role` once its container runs (waited for)."""

    def running():
        for name, p in pods(core, namespace).items():
            statuses = p.status.container_statuses or []
            if p.metadata.labels["elasticdl-nb/role"] == role and statuses:
                if statuses[0].state.running and not p.metadata.deletion_timestamp:
                    return name
        return None

    return wait_for(running, 180, f"a running {role} pod", poll=0.25)


def _ps_addresses(core, namespace: str) -> list[str]:
    """Where a worker reaches PS 0: its Service's cluster IP, and its pod's IP."""
    ps_pod = core.read_namespaced_pod(_pod(core, namespace, "ps"), namespace)
    (service,) = core.list_namespaced_service(namespace, label_selector=f"{m.LABEL_ROLE}=ps").items
    return [service.spec.cluster_ip, ps_pod.status.pod_ip]


def _outages(job, after_seq: int = 0) -> list[dict]:
    return [
        {**e.data, "seq": e.seq}
        for e in job.events(follow=False)
        if e.kind == "peer_unreachable" and e.seq > after_seq
    ]


def _last_seq(job) -> int:
    return max(e.seq for e in job.events(follow=False))


def _assert_running(job, what: str) -> None:
    state = job.status()["state"]
    assert state == "running", f"the job is {state} before {what}: raise the epochs"


def test_a_worker_cut_off_from_its_ps_then_the_ps_cut_off_from_everyone_the_job_goes_on(
    real_node, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    """Worker 0 cut off from the PS (not from the master) for 15 s at a random step; once
    it said so, the PS cut off from every pod for 15 s. Each time the job waits for the
    PS (TCP delivers what was dropped once the cut heals) and goes on; no process is
    relaunched; the journal has each spell, by the worker that saw it."""
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("partitions")
    job, records = _train(real_cluster, job_namespace, tmp_path, epochs=30)
    try:
        wait_for_step(job, rng.randrange(10, 60), timeout=300)
        _assert_running(job, "the first cut")
        worker = PodNetwork(real_node, core, job_namespace, _pod(core, job_namespace, "worker"))
        ps_at = _ps_addresses(core, job_namespace)
        before = _last_seq(job)
        with worker.cut_from(ps_at):
            time.sleep(CUT_SECONDS)
        cut_from_ps = wait_for(
            lambda: [o for o in _outages(job, before) if o["by"] == "worker 0"],
            120, "worker 0 to say that ps-0 did not answer", poll=1,
        )  # fmt: skip
        print(f"worker 0 cut off from ps-0 for {CUT_SECONDS} s: {cut_from_ps}")

        _assert_running(job, "the second cut")
        ps = PodNetwork(real_node, core, job_namespace, _pod(core, job_namespace, "ps"))
        before = _last_seq(job)
        with ps.cut_off():
            time.sleep(CUT_SECONDS)
        final = job.wait(timeout=900)
    finally:
        close_forward(job)
    assert final["state"] == "succeeded", final.get("error")
    ps_cut_off = _outages(job, before)
    print(f"ps-0 cut off for {CUT_SECONDS} s: {ps_cut_off}")

    for spell in cut_from_ps:
        assert spell["peer"] == "ps-0" and spell["healed"], spell
        # From the cut (or the worker's next exchange in it) to TCP's retransmission
        # after the heal (~51 s into a loss, by the kernel's doubling timeout).
        assert CUT_SECONDS - 5 <= spell["seconds"] <= CUT_SECONDS + 40, spell
    assert all(o["peer"] == "ps-0" and o["healed"] for o in ps_cut_off), ps_cut_off
    # A worker waiting for its exchange through the whole cut says so (one waiting at an
    # epoch's end for the master says nothing: the master, waiting for the PS, does).
    longest = max((o for o in ps_cut_off if o["by"].startswith("worker")),
                  key=lambda o: o["seconds"])  # fmt: skip
    assert longest["seconds"] >= CUT_SECONDS - 5, ps_cut_off
    events = list(job.events(follow=False))
    assert not [e for e in events if e.kind == "relaunch"]  # waited for, not replaced
    assert ledger_problems(job.dir, 1, [records], 30) == []


def test_a_worker_cut_off_from_the_master_has_its_work_given_to_the_others_within_the_budget(
    real_node, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    """Worker 0 cut off from the master (its Service IP and pod IP; the PS it still
    reaches) at a random step: SILENCE_SECONDS after its last word the master gives its
    work to worker 1 and replaces it (its pod deleted through the API, which still
    reaches its kubelet); every record once."""
    from kubernetes import client

    from elasticdl_nb.runtime.master.worker_silence import SILENCE_SECONDS

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("worker-cut-from-master")
    epochs = 20
    job, records = _train(real_cluster, job_namespace, tmp_path, epochs=epochs)
    try:
        wait_for_step(job, rng.randrange(10, 60), timeout=300)
        _assert_running(job, "the cut")
        worker = PodNetwork(real_node, core, job_namespace, _pod(core, job_namespace, "worker"))
        master_pod = core.read_namespaced_pod(_pod(core, job_namespace, "master"), job_namespace)
        (service,) = core.list_namespaced_service(
            job_namespace, label_selector=f"{m.LABEL_ROLE}=master"
        ).items
        with worker.cut_from([service.spec.cluster_ip, master_pod.status.pod_ip]):
            cut_at = time.time()
            wait_for(
                lambda: [e for e in job.events(follow=False)
                         if e.kind == "requeue" and e.data["worker"] == 0],
                SILENCE_SECONDS + 30, "worker 0's work given back", poll=0.5,
            )  # fmt: skip
        final = job.wait(timeout=900)
    finally:
        close_forward(job)
    assert final["state"] == "succeeded", final.get("error")
    events = list(job.events(follow=False))
    (gave_up,) = [e for e in events if e.kind == "peer_unreachable" and e.data["by"] == "master"]
    assert gave_up.data["peer"] == "worker-0" and not gave_up.data["healed"], gave_up.data
    requeued = next(e for e in events if e.kind == "requeue" and e.data["worker"] == 0)
    assert any(e.kind == "relaunch" and e.data["replaces"] == 0 for e in events)
    waited = requeued.time - cut_at
    print(f"worker 0 cut off from the master; its work went back {waited:.1f} s later")
    # Its last word came at most a report interval before the cut (it was training).
    assert SILENCE_SECONDS - 1 <= waited <= SILENCE_SECONDS + 2, waited
    assert ledger_problems(job.dir, 1, [records], epochs) == []


def test_a_lossy_ps_whose_bulk_connections_are_reset_loses_nothing(
    real_node, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    """5 % of the PS's packets dropped, in and out, for the whole job; for 20 s of it,
    2 % of what arrives on its bulk port answered with a reset. The job succeeds with
    every record once; the resets are in the journal, each spell healed."""
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("lossy-ps")
    epochs = 12
    job, records = _train(real_cluster, job_namespace, tmp_path, epochs=epochs)
    try:
        ps = PodNetwork(real_node, core, job_namespace, _running_pod(core, job_namespace, "ps"))
        with ps.loss(0.05):  # (from before the first step)
            wait_for_step(job, rng.randrange(10, 60), timeout=300)
            _assert_running(job, "the resets")
            before = _last_seq(job)
            with ps.resets(m.PS_BULK_PORT, 0.02):
                time.sleep(20)
            final = job.wait(timeout=900)
    finally:
        close_forward(job)
    assert final["state"] == "succeeded", final.get("error")
    resets = [o for o in _outages(job, before) if o["by"].startswith("worker")]
    print(f"during the resets: {resets[:5]} ({len(resets)} reports)")
    assert resets, "no worker met a reset"
    assert all(o["peer"] == "ps-0" and o["healed"] for o in resets), resets
    assert any("UNAVAILABLE" in o["detail"] for o in resets), resets
    assert ledger_problems(job.dir, 1, [records], epochs) == []


def test_an_allreduce_member_cut_off_from_its_successor_for_15_s_the_ring_goes_on(
    real_node, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    """A ring of three worker pods; worker 0 cut off from worker 1 (its successor) for
    15 s at a random step: the collective breaks, the master re-forms the group (the
    journal's `group` events say which member waited for which), and once the cut heals
    the ring trains on; every record of every epoch is applied once by every replica."""
    from kubernetes import client

    from elasticdl_nb.runtime.worker.replica_records import replica_problems
    from tests.integration.models import paced_loss

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("ring-cut")
    epochs = 25
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": paced_loss},
        data=(x, y),
        workers=3,
        strategy="allreduce",
        epochs=epochs,
        minibatch_size=32,
        record_ledger=True,
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )
    try:
        wait_for_step(job, rng.randint(20, 120), timeout=300)
        _assert_running(job, "the cut")
        first = PodNetwork(real_node, core, job_namespace, _pod(core, job_namespace, "worker", 0))
        second = PodNetwork(real_node, core, job_namespace, _pod(core, job_namespace, "worker", 1))
        before = _last_seq(job)
        with first.cut_from([second.ip]):
            time.sleep(CUT_SECONDS)
        final = job.wait(timeout=900)
    finally:
        close_forward(job)
    assert final["state"] == "succeeded", final.get("error")
    events = list(job.events(follow=False))
    groups = [e.data for e in events if e.kind == "group" and e.seq > before]
    failures = [g for g in groups if g["reason"] == "failure"]
    print(f"{len(failures)} failures during and after the cut: {failures[:3]}")
    assert failures, "the cut broke no collective"
    assert replica_problems(job.dir, [len(x)], 32, epochs) == []
