"""The master's hands on Kubernetes: worker and PS pods, a Service per PS, and what
happens to them reported back as normalized instance events.

The same `InstanceLauncher` the local backend implements, so the elastic policy
(runtime/master/instances.py) is the same on both. A PS is relaunched under its old
name (its Service, and so its address, stays); its ended pod is removed first. Every
object is owned by the master's Job: deleting the Job deletes the job.

A master that takes over from one that died (`adopt`) lists the job's worker and PS pods,
reports each one's state as the watch would, takes the memory an OOM had raised from the
newest pod of each role, and only then starts the watch, from that list's version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.backends.kubernetes.api import KubernetesError, call, created
from elasticdl_nb.backends.kubernetes.pod_events import instance_event
from elasticdl_nb.backends.kubernetes.pod_watch import PodWatch
from elasticdl_nb.runtime.master.site import EventSink, InstanceEvent
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.spec.kubernetes import bytes_quantity, parse_resources, quantity_bytes
from elasticdl_nb.vocabulary import INSTANCE_ENDED, InstanceState

log = logging.getLogger("elasticdl_nb.kubernetes")

OLD_POD_GONE_SECONDS = 60.0
# Beyond a shutdown's grace period: for the kubelet to notice its containers' ends and
# the watch to bring them.
SHUTDOWN_SLACK_SECONDS = 5.0


class PodLauncher:
    def __init__(
        self,
        spec: JobSpec,
        name: str,
        api,
        owner: dict[str, Any],
        on_event: EventSink,
        addresses: m.Addresses,
        fence: Callable[[], None] = lambda: None,
        first_use: Callable[[], None] | None = None,
    ):
        """`owner`: the owner reference of every pod it makes (the master's Job).
        `fence`: called before every pod it creates or deletes (the master's lease:
        a master another has replaced must not touch the job's pods).
        `first_use`: called once, by the first `launch` or `adopt` (from the master's
        main thread, once the runtime has set its signal handlers)."""
        self.spec, self.name, self.api = spec, name, api
        self.addresses = addresses
        self.memory: dict[str, str] = {}  # role -> memory of its next pods, after an OOM
        self.namespace = spec.namespace
        self.owner = owner
        self.on_event = on_event
        self._first_use = first_use
        self._fence = fence
        self._lock = threading.Lock()
        self._uids: dict[str, str] = {}  # pod name -> uid of the incarnation we made
        self._reported: dict[str, tuple] = {}  # pod name -> last event reported
        self._latest: dict[str, tuple] = {}  # pod name -> (last state seen, deleted)
        self._events_forbidden = False  # the master Role cannot list events
        self.watch = PodWatch(api, self.namespace, f"{m.LABEL_JOB}={name}", self._on_pod)

    def _begin(self, version: str | None = None) -> None:
        """Start watching (from `version`, else from a fresh list), once."""
        with self._lock:
            if self.watch.started:
                return
            first_use, self._first_use = self._first_use, None
            self.watch.start(version)
        if first_use is not None:
            first_use()

    # ------------------------------------------------------------------ InstanceLauncher

    def launch(self, role: str, instance_id: int, elastic: bool = False) -> None:
        self._begin()
        memory = self.memory.get(role)
        if role == "ps":  # (a PS's Service stays: master_site)
            body = m.ps_pod(self.spec, self.name, instance_id, self.owner, self.addresses, memory)
        else:
            body = m.worker_pod(
                self.spec, self.name, instance_id, self.owner, self.addresses, memory, elastic
            )
        pod_name = body["metadata"]["name"]
        self._remove_ended_pod(pod_name)  # a PS relaunched under its old name
        self._fence()
        created = call(
            f"create pod {pod_name}", self.api.create_namespaced_pod, self.namespace, body
        )
        uid = created["metadata"]["uid"]
        with self._lock:
            self._uids[pod_name] = uid
            self._reported.pop(pod_name, None)
            latest = self._latest.get(pod_name)
        # The watch may have seen the new pod before its uid was known here (and passed
        # it over); report that state now.
        if latest and (latest[0].get("metadata") or {}).get("uid") == uid:
            self._on_pod(*latest)

    def grow_memory(self, role: str) -> str | None:
        """After an OOM: the role's next pods get twice the memory, up to the spec's
        max_memory (default 4x the request). Returns 'OLD -> NEW', or None at the cap."""
        requested = parse_resources("resources", getattr(self.spec, f"{role}_resources"))
        if "memory" not in requested:
            return None  # no limit was set, so the OOM was the node's: more will not help
        base = quantity_bytes(requested["memory"])
        cap = quantity_bytes(self.spec.max_memory) if self.spec.max_memory else 4 * base
        current = quantity_bytes(self.memory.get(role, requested["memory"]))
        grown = min(2 * current, cap)
        if grown <= current:
            return None
        self.memory[role] = bytes_quantity(grown)
        return f"{bytes_quantity(current)} -> {self.memory[role]}"

    def adopt(self) -> set[tuple[str, int]]:
        """The worker and PS pods of the job that are the Job's (an earlier master made
        them): each one's state goes to the sink now, from this thread, as the watch
        would report it; the watch then follows from this list's version. The memory of
        each role's next pods is that of its newest pod (raised after an OOM)."""
        if self.watch.started:
            raise RuntimeError("adopt() comes before any launch")
        pods, version = self.watch.list_pods()
        ours = [p for p in pods if self._is_ours(p)]
        ours.sort(key=lambda p: (created(p), _index(p)))  # (seconds: a worker's index breaks ties)
        for pod in ours:
            meta = pod["metadata"]
            with self._lock:
                self._uids[meta["name"]] = meta["uid"]
            self._remember_memory(pod)
        for pod in ours:
            self._on_pod(pod, False)
        self._begin(version)
        return {(p["metadata"]["labels"][m.LABEL_ROLE], _index(p)) for p in ours}

    def _is_ours(self, pod: dict[str, Any]) -> bool:
        """A worker or PS pod of this job owned by the master's Job."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        owners = meta.get("ownerReferences") or []
        return (
            labels.get(m.LABEL_ROLE) in ("worker", "ps")
            and m.LABEL_INDEX in labels
            and any(o.get("uid") == self.owner["uid"] for o in owners)
        )

    def _remember_memory(self, pod: dict[str, Any]) -> None:
        """The memory limit of `pod` (pods come newest last) is what its role's next
        pods get, where it differs from the spec's: an earlier master raised it."""
        role = pod["metadata"]["labels"][m.LABEL_ROLE]
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        limit = ((containers[0].get("resources") or {}).get("limits") or {}).get("memory")
        asked = parse_resources("resources", getattr(self.spec, f"{role}_resources"))
        if not limit or "memory" not in asked:
            return
        if quantity_bytes(limit) != quantity_bytes(asked["memory"]):
            self.memory[role] = limit
        else:
            self.memory.pop(role, None)

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        self._delete_pod(m.pod_name(self.name, role, instance_id), grace=0 if force else None)

    def shutdown(self, grace_seconds: float) -> None:
        """Delete every worker and PS pod (the kubelet's SIGTERM, SIGKILL after the grace
        period), and wait until the watch has seen each one gone from the API server (or
        the grace period and SHUTDOWN_SLACK_SECONDS have passed), as the local backend
        waits for its processes: the journal then holds every instance's end, and a job
        that reads 'stopped' has no worker or PS pod left (nor their logs)."""
        selector = f"{m.LABEL_JOB}={self.name}"
        what = "list the job's pods"
        pods = call(what, self.api.list_namespaced_pod, self.namespace, label_selector=selector)
        deleting: dict[str, str] = {}  # pod name -> uid
        for pod in pods.get("items", []):
            meta = pod["metadata"]
            if meta["labels"].get(m.LABEL_ROLE) not in ("worker", "ps"):
                continue
            self._delete_pod(meta["name"], grace=int(grace_seconds))
            deleting[meta["name"]] = meta["uid"]
        # A pod's container ends before the kubelet lets the pod go: waiting for the end
        # alone left pods (and their logs) behind a job that already read 'stopped'.
        deadline = time.monotonic() + grace_seconds + SHUTDOWN_SLACK_SECONDS
        while time.monotonic() < deadline:
            with self._lock:
                if all(self._gone(name, uid) for name, uid in deleting.items()):
                    break
            time.sleep(0.1)
        self.watch.stop()

    def _gone(self, pod_name: str, uid: str) -> bool:
        """Whether the watch has seen this incarnation deleted (call with the lock held)."""
        latest = self._latest.get(pod_name)
        return latest is not None and latest[1] and latest[0]["metadata"].get("uid") == uid

    def _ended(self, pod_name: str) -> bool:
        """Whether this pod's end has been reported (call with the lock held)."""
        reported = self._reported.get(pod_name)
        return reported is not None and reported[0] in INSTANCE_ENDED

    # ------------------------------------------------------------------ watching

    def _on_pod(self, pod: dict[str, Any], deleted: bool) -> None:
        meta = pod.get("metadata") or {}
        pod_name, uid = meta.get("name", ""), meta.get("uid")
        event = instance_event(pod, deleted)
        if event is None:
            return
        if event.kind == InstanceState.DELETED:
            with self._lock:  # ask the API server only about the end of a pod of ours
                ours = self._uids.get(pod_name) == uid and not self._ended(pod_name)
            if ours:
                event = self._preemption(event, uid) or event
        with self._lock:
            self._latest[pod_name] = (pod, deleted)
            if self._uids.get(pod_name) != uid:
                return  # an earlier incarnation of a relaunched PS, or not ours
            seen = (event.kind, event.reason, event.exit_code)
            before = self._reported.get(pod_name)
            if before == seen:
                return  # the watch repeats states (re-lists, unrelated status changes)
            if before and before[0] in INSTANCE_ENDED:
                return  # an instance ends once (a preempted pod then also terminates)
            self._reported[pod_name] = seen
        self.on_event(event)

    def _preemption(self, deleted: InstanceEvent, uid: str | None) -> InstanceEvent | None:
        """A deleted pod that the scheduler preempted, told by its `Preempted` event.

        Until Kubernetes 1.26 the scheduler deletes a victim like anyone else, leaving
        no condition on the pod; the event it records is the only trace. Reading events
        takes the master Role's `list events`; without it a preemption stays 'deleted'."""
        if not uid or self._events_forbidden:
            return None
        try:
            found = call(
                "list the events of a deleted pod",
                self.api.list_namespaced_event,
                self.namespace,
                field_selector=f"involvedObject.uid={uid},reason=Preempted",
            )
        except KubernetesError as exc:
            self._events_forbidden = "HTTP 403" in str(exc)
            log.warning("cannot tell a preemption from a deletion: %s", exc)
            return None
        items = (found or {}).get("items") or []
        if not items:
            return None
        message = items[-1].get("message") or "by the scheduler"
        return InstanceEvent(
            deleted.role,
            deleted.instance_id,
            InstanceState.PREEMPTED,
            exit_code=deleted.exit_code,
            reason=f"Preempted: {message}",
        )

    # ------------------------------------------------------------------ API calls

    def _delete_pod(self, pod_name: str, grace: int | None) -> None:
        self._fence()
        call(
            f"delete pod {pod_name}",
            self.api.delete_namespaced_pod,
            pod_name,
            self.namespace,
            grace_period_seconds=grace,
            allow=(404,),
        )

    def _remove_ended_pod(self, pod_name: str) -> None:
        """Delete a leftover pod of this name and wait until the server has let it go."""
        deadline = time.monotonic() + OLD_POD_GONE_SECONDS
        deleted = False
        while time.monotonic() < deadline:
            found = call(
                f"read pod {pod_name}",
                self.api.read_namespaced_pod,
                pod_name,
                self.namespace,
                allow=(404,),
            )
            if found is None:
                return
            if not deleted:
                self._delete_pod(pod_name, grace=0)
                deleted = True
            time.sleep(0.2)
        raise KubernetesError(
            f"pod {pod_name} is still there {OLD_POD_GONE_SECONDS:.0f} s after being "
            "deleted; it cannot be relaunched under its name"
        )


def _index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][m.LABEL_INDEX])
