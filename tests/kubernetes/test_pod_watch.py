"""The master's pod watch against a real API server that restarts: it resumes, and when
its resourceVersion is gone (etcd compacted meanwhile) it lists again and reports the
pods deleted while it was not watching."""

from __future__ import annotations

import base64
import threading

import pytest

from elasticdl_nb.backends.kubernetes.pod_watch import PodWatch
from tests.integration.faults import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


class Seen:
    def __init__(self):
        self.lock = threading.Lock()
        self.changes: list[tuple[str, dict, bool]] = []

    def __call__(self, pod, deleted):
        with self.lock:
            self.changes.append((pod["metadata"]["name"], pod["metadata"].get("labels"), deleted))

    def has(self, name: str, deleted: bool = False, label: str | None = None) -> bool:
        with self.lock:
            return any(
                n == name and d == deleted and (label is None or label in (labels or {}))
                for n, labels, d in self.changes
            )


def _pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"app": "watched"}},
        "spec": {
            "nodeName": "a-node-no-kubelet-serves",
            "containers": [{"name": "c", "image": "x", "command": ["true"]}],
        },
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_the_watch_survives_a_restart_and_a_compaction_and_misses_no_deletion(
    k8s_cluster, k8s_admin_client, k8s_namespace
):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    seen = Seen()
    watch = PodWatch(core, k8s_namespace, "app=watched", seen, watch_seconds=5).start()
    try:
        for name in ("a", "b"):
            core.create_namespaced_pod(k8s_namespace, _pod(name))
        wait_for(lambda: seen.has("a") and seen.has("b"), 30, "both pods")

        # A restart alone: the watch resumes from its resourceVersion.
        k8s_cluster.restart_apiserver()
        core.patch_namespaced_pod("a", k8s_namespace, {"metadata": {"labels": {"step": "1"}}})
        wait_for(lambda: seen.has("a", label="step"), 60, "a change after the restart")
        assert watch.reconnects >= 1

        # While the server is down, pod b is deleted in etcd and etcd is compacted: the
        # watch's version is gone, so it must list again and notice b is missing.
        def delete_b_and_compact():
            deleted = k8s_cluster.etcd(
                "kv/deleterange", {"key": _b64(f"/registry/pods/{k8s_namespace}/b")}
            )
            assert deleted.get("deleted") == "1", deleted
            revision = deleted["header"]["revision"]
            k8s_cluster.etcd("kv/compaction", {"revision": revision, "physical": True})

        relists = watch.relists
        k8s_cluster.restart_apiserver(while_down=delete_b_and_compact)
        wait_for(lambda: seen.has("b", deleted=True), 60, "b reported deleted")
        assert watch.relists > relists
        core.patch_namespaced_pod("a", k8s_namespace, {"metadata": {"labels": {"step2": "1"}}})
        wait_for(lambda: seen.has("a", label="step2"), 30, "changes still arrive")
    finally:
        watch.stop()
        core.delete_namespaced_pod("a", k8s_namespace, grace_period_seconds=0)
