"""The master's pod launcher against a real kube-apiserver: pods and PS Services created
with owners and labels, pod status turned into instance events through a real watch,
a PS relaunched under its old name, the pods of a master that died taken over by the
next one. The test writes pod status itself, as a kubelet does (through the status
subresource)."""

from __future__ import annotations

import threading
import time

import pytest

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.launcher import PodLauncher
from elasticdl_nb.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


class Events:
    def __init__(self):
        self.seen, self._changed = [], threading.Condition()
        self.threads: list[str] = []  # the thread that reported each event

    def __call__(self, event):
        with self._changed:
            self.seen.append(event)
            self.threads.append(threading.current_thread().name)
            self._changed.notify_all()

    def kinds(self) -> list[tuple]:
        with self._changed:
            return [(e.role, e.instance_id, str(e.kind)) for e in self.seen]

    def wait_for(self, role, index, kind, timeout=20.0):
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for e in self.seen:
                    if (e.role, e.instance_id, e.kind) == (role, index, kind):
                        return e
                left = deadline - time.monotonic()
                assert left > 0, f"no {kind} event for {role} {index}; saw {self.seen}"
                self._changed.wait(left)


def _spec(namespace: str, tmp_path, **options) -> JobSpec:
    """Job "job", whose pods are bound to a node no kubelet serves: the tests write the
    pods' status themselves."""
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("spec:\n  nodeName: a-node-no-kubelet-serves\n")
    return JobSpec.from_options(
        data=["x"],
        backend="kubernetes",
        namespace=namespace,
        service_account="default",
        pod_template=str(elsewhere),
        **{f"{role}_priority_class": "" for role in ("master", "ps", "worker")},
        **options,
    )


def _master_job(api_client, spec: JobSpec) -> dict:
    """The master's Job (stored only: this cluster runs no job controller), and the
    owner reference it gives everything of the job."""
    from kubernetes import client

    made = client.BatchV1Api(api_client).create_namespaced_job(
        spec.namespace, m.master_job(spec, "job", ["spec.json"])
    )
    return m.owner_reference(made.metadata.name, made.metadata.uid)


def _launcher(core, namespace: str, tmp_path, events: Events, **options):
    """The master's Job (only its uid matters: it owns the rest) and a PodLauncher."""
    spec = _spec(namespace, tmp_path, **options)
    owner = _master_job(core.api_client, spec)
    addresses = m.Addresses.service_dns(spec, "job")
    return owner, PodLauncher(spec, "job", core, owner, events, addresses)


def set_status(core, namespace, name, status):
    core.patch_namespaced_pod_status(name, namespace, {"status": status})


def test_launch_watch_and_relaunch_a_ps_under_its_old_name(
    k8s_admin_client, k8s_namespace, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    events = Events()
    owner, launcher = _launcher(core, k8s_namespace, tmp_path, events, ps=1)
    try:
        launcher.launch("ps", 0)
        launcher.launch("worker", 0)
        events.wait_for("ps", 0, "started")
        ps = core.read_namespaced_pod("job-ps-0", k8s_namespace)
        assert ps.metadata.owner_references[0].uid == owner["uid"]
        assert ps.metadata.owner_references[0].kind == "Job"

        running = {"phase": "Running", "containerStatuses": [_container({"running": {}})]}
        set_status(core, k8s_namespace, "job-worker-0", running)
        events.wait_for("worker", 0, "running")
        oom = _container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
        set_status(
            core, k8s_namespace, "job-worker-0", {"phase": "Failed", "containerStatuses": [oom]}
        )
        assert events.wait_for("worker", 0, "oom").exit_code == 137

        crashed = _container({"terminated": {"exitCode": 1, "reason": "Error"}})
        set_status(
            core, k8s_namespace, "job-ps-0", {"phase": "Failed", "containerStatuses": [crashed]}
        )
        events.wait_for("ps", 0, "failed")
        old_uid = ps.metadata.uid
        launcher.launch("ps", 0)  # the same name: the ended pod is removed first
        relaunched = core.read_namespaced_pod("job-ps-0", k8s_namespace)
        assert relaunched.metadata.uid != old_uid
        # The new incarnation reports afresh; the old one's deletion is not reported.
        ps_kinds = lambda: [e.kind for e in events.seen if e.role == "ps"]  # noqa: E731
        deadline = time.monotonic() + 20
        while ps_kinds().count("started") < 2:
            assert time.monotonic() < deadline, ps_kinds()
            time.sleep(0.05)
        time.sleep(1)  # room for a wrongly reported deletion of the old pod to show up
        assert ps_kinds() == ["started", "failed", "started"]

        launcher.kill("worker", 0, force=True)
        launcher.shutdown(0)
        # It returns once the pods are gone from the API server, not only ended.
        ours = "elasticdl-nb/role in (worker,ps)"
        assert core.list_namespaced_pod(k8s_namespace, label_selector=ours).items == []
    finally:
        launcher.watch.stop()


def test_a_pod_the_scheduler_preempted_is_told_from_one_deleted_by_someone(
    k8s_admin_client, k8s_namespace, tmp_path
):
    """Before Kubernetes 1.26 the scheduler deletes a victim like anyone would; only its
    `Preempted` event, recorded as the scheduler records it, tells the two apart."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    events = Events()
    _, launcher = _launcher(core, k8s_namespace, tmp_path, events)
    try:
        for index in (0, 1):
            launcher.launch("worker", index)
            events.wait_for("worker", index, "started")
        victim = core.read_namespaced_pod("job-worker-0", k8s_namespace)
        core.create_namespaced_event(
            k8s_namespace,
            {
                "metadata": {"generateName": "job-worker-0."},
                "involvedObject": {"kind": "Pod", "namespace": k8s_namespace,
                                   "name": "job-worker-0", "uid": victim.metadata.uid},
                "reason": "Preempted",
                "message": f"Preempted by {k8s_namespace}/big on node n1",
                "type": "Normal",
                "source": {"component": "default-scheduler"},
            },
        )  # fmt: skip
        for index in (0, 1):
            core.delete_namespaced_pod(f"job-worker-{index}", k8s_namespace, grace_period_seconds=0)
        preempted = events.wait_for("worker", 0, "preempted")
        assert preempted.reason == f"Preempted: Preempted by {k8s_namespace}/big on node n1"
        assert events.wait_for("worker", 1, "deleted").reason == "pod deleted"
    finally:
        launcher.watch.stop()


def test_a_new_master_adopts_the_pods_reports_each_once_and_keeps_the_raised_memory(
    k8s_admin_client, k8s_namespace, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    first_events = Events()
    memory = {"worker_resources": "cpu=100m,memory=1Gi", "max_memory": "4Gi"}
    owner, first = _launcher(core, k8s_namespace, tmp_path, first_events, ps=1, **memory)
    running = {"phase": "Running", "containerStatuses": [_container({"running": {}})]}
    oom = _container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    try:
        first.launch("ps", 0)
        first.launch("worker", 0)
        set_status(core, k8s_namespace, "job-ps-0", running)
        failed = {"phase": "Failed", "containerStatuses": [oom]}
        set_status(core, k8s_namespace, "job-worker-0", failed)
        first_events.wait_for("worker", 0, "oom")
        assert first.grow_memory("worker") == "1Gi -> 2Gi"
        first.launch("worker", 1)  # with 2Gi
        set_status(core, k8s_namespace, "job-worker-1", running)
        first_events.wait_for("worker", 1, "running")
    finally:
        first.watch.stop()  # the first master dies
    # Not the job's: another job's pod, and one of this job's pods the Job does not own.
    spec = first.spec
    addresses = m.Addresses.service_dns(spec, "job")
    other = m.worker_pod(spec, "other", 0, owner, addresses)
    core.create_namespaced_pod(k8s_namespace, other)
    stray = m.worker_pod(spec, "job", 7, {**owner, "uid": "0000-not-the-job"}, addresses)
    core.create_namespaced_pod(k8s_namespace, stray)

    events = Events()
    second = PodLauncher(spec, "job", core, owner, events, addresses)
    try:
        assert second.adopt() == {("ps", 0), ("worker", 0), ("worker", 1)}
        # Each pod's state as it is now, reported from the adopting thread, before adopt
        # returned; the memory an OOM raised holds for the next worker pods.
        assert sorted(events.kinds()) == [
            ("ps", 0, "running"),
            ("worker", 0, "oom"),
            ("worker", 1, "running"),
        ]
        assert set(events.threads) == {threading.current_thread().name}
        assert second.memory == {"worker": "2Gi"}
        assert second.grow_memory("worker") == "2Gi -> 4Gi"
        # The watch goes on from the list: what changes after it comes once, nothing
        # before it comes again.
        succeeded = _container({"terminated": {"exitCode": 0, "reason": "Completed"}})
        ended = {"phase": "Succeeded", "containerStatuses": [succeeded]}
        set_status(core, k8s_namespace, "job-worker-1", ended)
        events.wait_for("worker", 1, "succeeded")
        time.sleep(1)  # room for a repeated or stray event to show up
        assert events.kinds()[3:] == [("worker", 1, "succeeded")]
        assert events.threads[3] == "pod-watch"
        # Launched by the new master: the raised memory.
        second.launch("worker", 2)
        pod = core.read_namespaced_pod("job-worker-2", k8s_namespace)
        assert pod.spec.containers[0].resources.limits["memory"] == "4Gi"
    finally:
        second.watch.stop()


def _container(state):
    return {
        "name": "c",
        "image": "elasticdl-nb:0.1.0",
        "imageID": "",
        "ready": "running" in state,
        "restartCount": 0,
        "state": state,
    }
