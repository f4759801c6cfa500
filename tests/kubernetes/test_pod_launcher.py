"""The master's pod launcher against a real kube-apiserver: pods and PS Services created
with owners and labels, pod status turned into instance events through a real watch,
a PS relaunched under its old name. The test writes pod status itself, as a kubelet does
(through the status subresource)."""

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

    def __call__(self, event):
        with self._changed:
            self.seen.append(event)
            self._changed.notify_all()

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


def _launcher(core, namespace: str, tmp_path, events: Events, **options):
    """A master pod (only its uid matters: it owns the rest) and a started PodLauncher
    for job "job", whose pods are bound to a node no kubelet serves: the tests write
    the pods' status themselves."""
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("spec:\n  nodeName: a-node-no-kubelet-serves\n")
    spec = JobSpec.from_options(
        data=["x"],
        backend="kubernetes",
        namespace=namespace,
        service_account="default",
        pod_template=str(elsewhere),
        **{f"{role}_priority_class": "" for role in ("master", "ps", "worker")},
        **options,
    )
    master = core.create_namespaced_pod(namespace, m.master_pod(spec, "job", ["spec.json"]))
    addresses = m.Addresses.service_dns(spec, "job")
    return master, PodLauncher(spec, "job", core, master.metadata.uid, events, addresses).start()


def set_status(core, namespace, name, status):
    core.patch_namespaced_pod_status(name, namespace, {"status": status})


def test_launch_watch_and_relaunch_a_ps_under_its_old_name(
    k8s_admin_client, k8s_namespace, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    events = Events()
    master, launcher = _launcher(core, k8s_namespace, tmp_path, events, ps=1)
    try:
        launcher.launch("ps", 0)
        launcher.launch("worker", 0)
        events.wait_for("ps", 0, "started")
        ps = core.read_namespaced_pod("job-ps-0", k8s_namespace)
        assert ps.metadata.owner_references[0].uid == master.metadata.uid

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
        deadline = time.monotonic() + 20
        ours = "elasticdl-nb/role in (worker,ps)"
        while core.list_namespaced_pod(k8s_namespace, label_selector=ours).items:
            assert time.monotonic() < deadline, "worker and PS pods are still there"
            time.sleep(0.2)
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


def _container(state):
    return {
        "name": "c",
        "image": "elasticdl-nb:0.1.0",
        "imageID": "",
        "ready": "running" in state,
        "restartCount": 0,
        "state": state,
    }
