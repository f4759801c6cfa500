"""What a job's master learns at start in its pod, against a real kube-apiserver (the
node-less cluster: the master's pod and the job's pods are stored, their status written
by the test): its owner (the Job), whether an earlier master still holds the job's lease,
whether the job is over already, and whether it can take the job over at all."""

from __future__ import annotations

import json
import threading
import time

import pytest

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes import master_site
from elasticdl_nb.backends.kubernetes.api import KubernetesError
from elasticdl_nb.backends.kubernetes.master_lease import MasterLease
from elasticdl_nb.backends.kubernetes.master_site import KubernetesSite
from elasticdl_nb.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


def _spec(namespace: str, tmp_path, **options) -> JobSpec:
    elsewhere = tmp_path / "elsewhere.yaml"  # no kubelet serves that node
    elsewhere.write_text("spec:\n  nodeName: a-node-no-kubelet-serves\n")
    options.setdefault("shared_volume", "hostPath:/srv/jobs")
    return JobSpec.from_options(
        data=["x"],
        backend="kubernetes",
        namespace=namespace,
        name="job",
        service_account="default",
        pod_template=str(elsewhere),
        **{f"{role}_priority_class": "" for role in ("master", "ps", "worker")},
        **options,
    )


def _job_and_master_pod(api_client, spec: JobSpec, pod_name: str) -> dict:
    """The master's Job (stored: no job controller here) and a pod of it as the Job
    controller makes them; returns the Job's owner reference."""
    from kubernetes import client

    job = client.BatchV1Api(api_client).create_namespaced_job(
        spec.namespace, m.master_job(spec, "job", ["spec.json"])
    )
    _master_pod(api_client, spec, job, pod_name)
    return m.owner_reference(job.metadata.name, job.metadata.uid)


def _master_pod(api_client, spec: JobSpec, job, pod_name: str) -> None:
    from kubernetes import client

    template = m.master_job(spec, "job", ["spec.json"])["spec"]["template"]
    controller = {"apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name,
                  "uid": job.metadata.uid, "controller": True}  # fmt: skip
    pod = {
        "metadata": {**template["metadata"], "name": pod_name, "ownerReferences": [controller]},
        "spec": template["spec"],
    }
    client.CoreV1Api(api_client).create_namespaced_pod(spec.namespace, pod)


@pytest.mark.parametrize("volume", ["", "hostPath:/srv/jobs"], ids=["no-volume", "hostPath"])
def test_a_master_without_the_journal_beside_the_job_s_pods_ends_them_and_fails(
    k8s_admin_client, k8s_namespace, tmp_path, volume
):
    """The master pod was replaced, and the new one does not see the journal (it was in
    the old pod's own volume, or on another node's hostPath): the job cannot be taken
    over, and starting it again beside the pods that ran on would train twice."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    spec = _spec(k8s_namespace, tmp_path, shared_volume=volume, ps=1)
    owner = _job_and_master_pod(k8s_admin_client, spec, "job-master-bbbbb")
    addresses = m.Addresses.service_dns(spec, "job")
    for pod in (
        m.ps_pod(spec, "job", 0, owner, addresses),
        m.worker_pod(spec, "job", 0, owner, addresses),
        m.worker_pod(spec, "other", 0, owner, addresses),  # not this job's
    ):
        core.create_namespaced_pod(k8s_namespace, pod)
    job_dir = tmp_path / "job"  # what this master sees: no journal
    job_dir.mkdir()

    site = KubernetesSite(spec, "job", job_dir, k8s_admin_client, "job-master-bbbbb")
    with pytest.raises(KubernetesError) as refused:
        site.open()
    # It held the job's lease (to write the job's failure, as its process would): let it
    # go, or its renewals would outlive the namespace and fence this process.
    site.fence.release()
    message = str(refused.value)
    if volume:
        assert "its journal" in message and "is not on the shared volume" in message
        assert "shared_volume='pvc:CLAIM', ReadWriteMany" in message
    else:
        assert message.startswith("the master pod was replaced and its journal was in the pod")
        assert "give shared_volume=" in message.lower()
    assert "job-ps-0, job-worker-0, now ended" in message
    # Its pods are ended (a kubelet would stop them now); another job's are not.
    ending = {
        p.metadata.name: p.metadata.deletion_timestamp is not None
        for p in core.list_namespaced_pod(k8s_namespace, label_selector=m.LABEL_ROLE).items
    }
    assert ending == {
        "job-master-bbbbb": False,
        "job-ps-0": True,
        "job-worker-0": True,
        "other-worker-0": False,
    }


def test_a_master_restarted_after_the_end_was_recorded_exits_with_it(
    k8s_admin_client, k8s_namespace, tmp_path, monkeypatch
):
    """The kubelet restarts a master that failed after it wrote the final state (one
    that could not start exits with 1): the job is over, the Job must complete."""
    message = tmp_path / "termination-log"
    monkeypatch.setattr(master_site, "TERMINATION_LOG", message)
    spec = _spec(k8s_namespace, tmp_path)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    state = {"name": "job", "state": "failed", "error": "the master cannot start: ..."}
    (job_dir / "state.json").write_text(json.dumps(state))
    site = KubernetesSite(spec, "job", job_dir, k8s_admin_client, "job-master-ccccc")
    with pytest.raises(SystemExit) as exited:
        site.open()
    assert exited.value.code == 0
    assert json.loads(message.read_text()) == state


def test_a_new_master_waits_for_the_earlier_one_s_lease_and_knows_its_job_from_the_pod(
    k8s_admin_client, k8s_namespace, tmp_path
):
    """The earlier master's pod is deleted while it still holds the job's lease: the new
    master waits until the lease is let go (as a master leaving on SIGTERM lets it go)."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    batch = client.BatchV1Api(k8s_admin_client)
    spec = _spec(k8s_namespace, tmp_path, ps=1)
    owner = _job_and_master_pod(k8s_admin_client, spec, "job-master-old00")
    exits: list[int] = []
    coordination = client.CoordinationV1Api(k8s_admin_client)
    earlier = MasterLease(
        coordination, k8s_namespace, "job-master", owner, "job-master-old00", exits.append
    )
    assert earlier.acquire()
    # The old master pod is deleted (its kubelet has yet to stop it); the Job made a new one.
    core.delete_namespaced_pod("job-master-old00", k8s_namespace)
    job = batch.read_namespaced_job("job-master", k8s_namespace)
    _master_pod(k8s_admin_client, spec, job, "job-master-new00")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "events.jsonl").write_text("")  # the journal is here

    site = KubernetesSite(spec, "job", job_dir, k8s_admin_client, "job-master-new00")
    opened = threading.Thread(target=site.open)
    opened.start()
    try:
        time.sleep(2)
        assert opened.is_alive(), "it did not wait for the earlier master's lease"
        earlier.release()
        opened.join(10)
        assert not opened.is_alive()
        holder = coordination.read_namespaced_lease("job-master", k8s_namespace).spec
        assert holder.holder_identity.startswith("job-master-new00_"), holder
        assert site.owner == owner
        (ps_service,) = [
            s
            for s in core.list_namespaced_service(k8s_namespace).items
            if s.metadata.name == "job-ps-0"
        ]
        assert ps_service.metadata.owner_references[0].uid == owner["uid"]
        assert site.ps_addrs == [f"{ps_service.spec.cluster_ip}:{m.PS_PORT}"]

        # SIGTERM: its pod alone goes while the Job stays; or the Job is being deleted.
        assert site.job_going() is False
        batch.delete_namespaced_job("job-master", k8s_namespace, propagation_policy="Foreground")
        assert site.job_going() is True
    finally:
        opened.join(30)
        site.fence.release()  # (else its renewals outlive the namespace, and it is fenced)
    assert exits == []
