"""The master's lease against a real kube-apiserver (the node-less cluster): a successor
waits while the holder renews, takes a released lease at once, and a holder frozen past
its renewal deadline (SIGSTOP, a real process) is fenced: thawed, it exits without one
more journal event, while its successor continues the journal. The lease's times are
shortened here (a 3 s lease); the real ones are the module's constants."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes import master_lease
from elasticdl_nb.backends.kubernetes.master_lease import FENCED_EXIT, MasterLease
from elasticdl_nb.runtime.master.journal import Journal, read_journal_file
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import EventKind
from tests.integration.faults import fault_rng, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

SHORT = {"LEASE_SECONDS": 3, "RENEW_DEADLINE": 2.0, "RENEW_EVERY": 0.3}


@pytest.fixture
def short_lease(monkeypatch):
    for name, value in SHORT.items():
        monkeypatch.setattr(master_lease, name, value)


def _owner(api_client, namespace: str) -> dict:
    """A master Job to own the lease (an owner that does not exist would have the garbage
    collector delete it)."""
    from kubernetes import client

    spec = JobSpec.from_options(data=["x"], backend="kubernetes", namespace=namespace, name="job")
    job = client.BatchV1Api(api_client).create_namespaced_job(
        namespace, m.master_job(spec, "job", ["spec.json"])
    )
    return m.owner_reference(job.metadata.name, job.metadata.uid)


def _lease(api_client, namespace: str, owner: dict, holder: str, exits: list) -> MasterLease:
    from kubernetes import client

    api = client.CoordinationV1Api(api_client)
    return MasterLease(api, namespace, "job-master", owner, holder, exit_process=exits.append)


def _read(api_client, namespace: str) -> dict:
    from kubernetes import client

    lease = client.CoordinationV1Api(api_client).read_namespaced_lease("job-master", namespace)
    return {"holder": lease.spec.holder_identity, "transitions": lease.spec.lease_transitions}


def test_a_successor_waits_while_the_holder_renews_and_takes_a_released_lease_at_once(
    k8s_admin_client, k8s_namespace, short_lease
):
    owner = _owner(k8s_admin_client, k8s_namespace)
    exits: list[int] = []
    first = _lease(k8s_admin_client, k8s_namespace, owner, "job-master-aaaaa", exits)
    assert first.acquire()
    second = _lease(k8s_admin_client, k8s_namespace, owner, "job-master-bbbbb", exits)
    taken = threading.Thread(target=second.acquire)
    taken.start()
    # Twice the lease: it is renewed, so never free.
    time.sleep(2 * SHORT["LEASE_SECONDS"])
    assert taken.is_alive(), "the successor took a lease its holder renews"
    assert _read(k8s_admin_client, k8s_namespace) == {"holder": first.identity, "transitions": 0}

    released = time.monotonic()
    first.release()
    taken.join(5)
    assert not taken.is_alive()
    waited = time.monotonic() - released
    assert waited < SHORT["LEASE_SECONDS"], f"waited {waited:.1f} s for a released lease"
    assert _read(k8s_admin_client, k8s_namespace) == {"holder": second.identity, "transitions": 1}
    second.release()
    assert exits == []  # neither was fenced: the first let go, the second held on


HOLDER = textwrap.dedent(
    """
    import sys, time
    from kubernetes import client, config
    from elasticdl_nb.backends.kubernetes import master_lease
    from elasticdl_nb.runtime.master.journal import Journal
    from elasticdl_nb.vocabulary import EventKind

    kubeconfig, namespace, owner_uid, journal_path, short = sys.argv[1:6]
    for name, value in eval(short).items():
        setattr(master_lease, name, value)
    api = client.CoordinationV1Api(config.new_client_from_config(config_file=kubeconfig))
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "job-master",
             "uid": owner_uid, "controller": True, "blockOwnerDeletion": True}
    lease = master_lease.MasterLease(api, namespace, "job-master", owner, "job-master-old00")
    assert lease.acquire()
    journal = Journal(__import__("pathlib").Path(journal_path), fence=lease.check)
    while True:  # a master busy with its job: an event every 50 ms
        journal.append(EventKind.PHASE, phase="old master", previous="", at=time.time())
        time.sleep(0.05)
    """
)


def test_a_frozen_master_is_fenced_thawed_it_exits_and_adds_nothing_to_the_journal(
    k8s_cluster, k8s_admin_client, k8s_namespace, short_lease, tmp_path
):
    """A real process holds the lease and appends to the journal; SIGSTOP at a random
    moment; a successor takes the lease once it expired and continues the journal; SIGCONT:
    the old master exits with FENCED_EXIT, and the journal's numbering runs on without a
    break (an event of the old one's after the takeover would repeat a number)."""
    rng = fault_rng("frozen-master")
    owner = _owner(k8s_admin_client, k8s_namespace)
    path = tmp_path / "events.jsonl"
    old = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(k8s_cluster.admin_kubeconfig), k8s_namespace,
         owner["uid"], str(path), repr(SHORT)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: path.exists() and path.stat().st_size > 0, 30, "the old master's events")
        time.sleep(rng.uniform(0.0, 1.0))
        old.send_signal(signal.SIGSTOP)
        stopped_at = time.time()

        exits: list[int] = []
        successor = _lease(k8s_admin_client, k8s_namespace, owner, "job-master-new00", exits)
        assert successor.acquire()
        took_over = time.time()
        assert took_over - stopped_at >= SHORT["LEASE_SECONDS"], "took a lease not yet expired"
        journal = Journal(path, fence=successor.check)
        taken = journal.append(EventKind.PHASE, phase="new master", previous="")
        last_old = max(e.data["at"] for e in journal.continued)
        assert last_old <= stopped_at + 0.1

        old.send_signal(signal.SIGCONT)
        code = old.wait(timeout=10)
        for _ in range(5):  # the new master goes on
            journal.append(EventKind.PHASE, phase="new master", previous="")
        journal.close()
        successor.release()
    finally:
        if old.poll() is None:
            os.kill(old.pid, signal.SIGKILL)
            old.wait()
    log = old.stderr.read()
    assert code == FENCED_EXIT, log
    assert "this master stops acting and exits" in log, log
    events = list(read_journal_file(path))
    assert [e.seq for e in events] == list(range(len(events)))  # one writer at a time
    after = [e for e in events if e.seq > taken.seq]
    assert {e.data["phase"] for e in after} == {"new master"}, after
    assert exits == []
    print(f"taken over {took_over - stopped_at:.1f} s after the freeze; old exited {code}")
