"""A test kubelet, and scheduler, for the test cluster (cluster.py), which has neither:
pods run as local processes, so tests can run real jobs against the real API server.

`TestKubelet` registers a Node ("test-node") and watches the pods of all namespaces, as
the admin. It binds each unscheduled pod to its node if the pod's resource requests fit
(otherwise the pod gets the scheduler's Unschedulable condition, until pods go away),
and runs the first container of each pod bound there: a process with the container's
environment only, its volumes bind-mounted at their real paths in a mount namespace of
its own (kubelet_container.py), its output in `<cluster workdir>/pod-logs/`. It reports
the pod's status as a kubelet does (kubelet_status.py); a container that cannot start
yet (its image missing, a Secret or ConfigMap not there yet) is retried every second.
Deleting a pod stops its process: SIGTERM, SIGKILL after the grace period (at most
10 s). Tests inject faults with `oom_kill`, `preempt`, `evict` and `missing_images`, or
signal `pid(...)` themselves.

There is no kube-proxy or DNS: a pod selected by exactly one Service gets that
Service's cluster IP (cluster.py puts the range on loopback) as its pod IP, so what it
serves on its POD_IP is reachable at the Service's address; any other pod gets an
address of its own in 127.2.0.0/16. Pods in a namespace labelled `LABEL_OFF` are left
alone (tests that do not use the kubelet work in such namespaces, see conftest.py).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.kubernetes import kubelet_container as box
from tests.kubernetes import kubelet_status as say

log = logging.getLogger(__name__)

NODE_NAME = "test-node"
LABEL_OFF = {"elasticdl-nb.test/kubelet": "off"}  # on a namespace: its pods are left alone
MAX_GRACE_SECONDS = 10
RETRY_SECONDS = 1.0
# What a write about a pod may meet: the pod is gone, or its name is a newer pod's now.
GONE = (404, 409, 422)


@dataclass(eq=False)
class _Run:
    """A pod bound to this node: its process, once started, and how it ends."""

    pod: dict  # as last seen
    log: Path
    dir: Path
    proc: subprocess.Popen | None = None
    ip: str = ""
    started: str = ""
    waiting: dict | None = None  # why it has not started, as last reported
    deleting: bool = False
    done: bool = False  # the exit is reported
    oom: bool = False  # how a kill is reported: OOMKilled, or the pod Evicted
    evicted: bool = False
    exited: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> tuple[str, str]:
        return self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]


class TestKubelet:
    """See the module's docstring. `start()` returns once the pods present are seen."""

    __test__ = False  # not a pytest test class, despite the name
    _live: set[TestKubelet] = set()  # started ones: the last to stop removes mount points

    def __init__(self, cluster, node_name: str = NODE_NAME, capacity: dict | None = None):
        self.cluster = cluster
        self.node_name = node_name
        # Room for a few default jobs (each asks for 4 cpu, 7Gi) and the pods of tests
        # before that are still terminating; the processes are not held to it.
        self.capacity = capacity or {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.labels = {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux"}
        self.missing_images: set[str] = set()  # besides every image named "missing/..."
        self.logs_dir = cluster.workdir / "pod-logs"
        self.pods_dir = cluster.workdir / "pods"
        self._pods: dict[str, dict] = {}  # uid -> pod: the unscheduled and those bound here
        self._runs: dict[str, _Run] = {}  # uid -> run, until the pod is deleted
        self._latest: dict[tuple[str, str], _Run] = {}  # (namespace, name) -> its last run
        self._all_runs: list[_Run] = []
        self._unschedulable: dict[str, str] = {}  # uid -> the reason reported
        self._off_namespaces: dict[str, bool] = {}
        self._ips = itertools.count(1)
        self._lock = threading.Lock()  # starting a process vs. deleting its pod or stop()
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._stream = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 30) -> TestKubelet:
        self._api = config.new_client_from_config(config_file=str(self.cluster.admin_kubeconfig))
        self._core = client.CoreV1Api(self._api)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        node = {"metadata": {"name": self.node_name, "labels": self.labels}}
        try:  # a Node takes its status on create
            body = node | {"status": say.node_status(self.capacity)}
            self._core.create_node(body, _preload_content=False)
        except ApiException as err:
            if err.status != 409:
                raise
            body = {"status": say.node_status(self.capacity)}
            self._core.patch_node_status(self.node_name, body, _preload_content=False)
        TestKubelet._live.add(self)
        atexit.register(self.stop)  # also when the session ends without teardown
        self._thread = threading.Thread(target=self._watch_loop, name="kubelet", daemon=True)
        self._thread.start()
        if not self._synced.wait(timeout):
            raise TimeoutError(f"the test kubelet has not listed the pods in {timeout}s")
        return self

    def stop(self) -> None:
        """Kill the processes of all pods and stop watching (the pods stay as they are)."""
        with self._lock:  # no process starts after this
            if self._stopping.is_set() or self._thread is None:
                return
            self._stopping.set()
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.shutdown()  # ends the watch's blocked read at once
        for run in self._all_runs:
            self._signal(run, signal.SIGKILL)
        for run in self._all_runs:
            if run.proc is not None:
                run.exited.wait(5)
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self._core.delete_node(self.node_name, _preload_content=False, _request_timeout=5)
        self._api.close()
        TestKubelet._live.discard(self)
        if not TestKubelet._live:
            box.remove_mount_points()

    def __enter__(self) -> TestKubelet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- for tests ---------------------------------------------------------------------

    def logs(self, namespace: str, name: str) -> str:
        """The output of the last pod of that name run here ("" if none was, yet)."""
        run = self._latest.get((namespace, name))
        return run.log.read_text(errors="replace") if run else ""

    def pid(self, namespace: str, name: str) -> int | None:
        """The pid of the pod's command while it runs, else None."""
        run = self._latest.get((namespace, name))
        if run is None or run.proc is None or run.exited.is_set():
            return None
        return run.proc.pid

    def oom_kill(self, namespace: str, name: str) -> None:
        """Kill the pod's process as the kernel's OOM killer would: reported OOMKilled."""
        run = self._run(namespace, name)
        run.oom = True
        self._signal(run, signal.SIGKILL)

    def evict(self, namespace: str, name: str) -> None:
        """Evict the pod for memory pressure: killed, the pod Failed with reason Evicted."""
        run = self._run(namespace, name)
        run.evicted = True
        self._signal(run, signal.SIGKILL)

    def preempt(self, namespace: str, name: str) -> None:
        """Preempt the pod as the scheduler (1.26+) does: a DisruptionTarget condition,
        then a deletion with the pod's grace period."""
        got = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        pod = json.loads(got.data)
        self._patch_status(pod, say.preempted())
        options = client.V1DeleteOptions(
            grace_period_seconds=pod["spec"].get("terminationGracePeriodSeconds", 30),
            preconditions=client.V1Preconditions(uid=pod["metadata"]["uid"]),
        )
        self._call(self._core.delete_namespaced_pod, name, namespace, body=options)

    def _run(self, namespace: str, name: str) -> _Run:
        if (namespace, name) not in self._latest:
            raise LookupError(f"the test kubelet has not run a pod {namespace}/{name}")
        return self._latest[namespace, name]

    # --- the API server ----------------------------------------------------------------

    def _call(self, method, *args, **kwargs):
        """`method(...)` (the raw response), retried while the API server is out of reach
        (e.g. restarting); None if the pod is gone or its name is a newer pod's now."""
        deadline = time.monotonic() + 30
        while True:
            try:
                return method(*args, _preload_content=False, **kwargs)
            except ApiException as err:
                if err.status in GONE:
                    return None
                if err.status < 500 or time.monotonic() > deadline:
                    raise
            except urllib3.exceptions.HTTPError:
                if time.monotonic() > deadline or self._stopping.is_set():
                    raise
            time.sleep(0.5)

    def _patch_status(self, pod: dict, status: dict) -> None:
        # With the uid in the patch, the API server refuses it for a newer pod of that name.
        meta = pod["metadata"]
        body = {"metadata": {"uid": meta["uid"]}, "status": status}
        self._call(self._core.patch_namespaced_pod_status, meta["name"], meta["namespace"], body)

    # --- watching pods -----------------------------------------------------------------

    def _watch_loop(self) -> None:
        version = None
        while not self._stopping.is_set():
            try:
                version = self._watch(version or self._relist())
            except ApiException as err:
                if err.status == 410:  # too old to resume from: list afresh
                    version = None
                else:
                    log.warning("test kubelet: watch failed: %s", err)
                    self._stopping.wait(1)
            except Exception as err:  # e.g. the API server restarting: resume
                if not self._stopping.is_set():
                    log.warning("test kubelet: watch failed: %r", err)
                    self._stopping.wait(1)

    def _relist(self) -> str:
        listed = json.loads(self._core.list_pod_for_all_namespaces(_preload_content=False).data)
        pods = {p["metadata"]["uid"]: p for p in listed["items"]}
        for uid in set(self._pods) - set(pods):  # deleted while not watched
            self._handle("DELETED", self._pods[uid])
        for pod in pods.values():
            self._handle("ADDED", pod)
        self._synced.set()
        return listed["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> str:
        """Handle the pod events from `version` on until the server ends the watch;
        returns the version to resume from."""
        self._stream = stream = self._core.list_pod_for_all_namespaces(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _preload_content=False,
            _request_timeout=330,
        )
        try:
            for line in stream:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise ApiException(status=event["object"].get("code"), reason=line)
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self._handle(event["type"], event["object"])
        finally:
            self._stream = None
            stream.release_conn()
        return version

    def _handle(self, kind: str, pod: dict) -> None:
        meta, node = pod["metadata"], pod["spec"].get("nodeName")
        try:
            if node not in (None, self.node_name) or self._off(meta["namespace"]):
                self._pods.pop(meta["uid"], None)  # bound to another node now
                return
            if kind == "DELETED":
                self._forget(meta["uid"])
            else:
                self._pods[meta["uid"]] = pod
                run = self._runs.get(meta["uid"])
                if run is not None:
                    run.pod = pod
                if node and meta.get("deletionTimestamp"):
                    self._terminate(pod)
                elif node and run is None and pod["status"].get("phase") == "Pending":
                    self._start(pod)
            self._schedule()
        except Exception:  # one pod's trouble must not stop the others
            log.exception("test kubelet: %s pod %s/%s", kind, meta["namespace"], meta["name"])

    def _off(self, namespace: str) -> bool:
        if namespace not in self._off_namespaces:
            got = self._call(self._core.read_namespace, namespace)
            if got is None:
                return True  # gone
            labels = json.loads(got.data)["metadata"].get("labels") or {}
            self._off_namespaces[namespace] = LABEL_OFF.items() <= labels.items()
        return self._off_namespaces[namespace]

    # --- scheduling --------------------------------------------------------------------

    def _schedule(self) -> None:
        """Bind the pods that fit, oldest first; tell the others why not (once)."""
        running = [
            p
            for p in self._pods.values()
            if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        waiting = [
            p
            for p in self._pods.values()
            if not p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and p["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
        ]
        waiting.sort(key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        for pod in waiting:
            uid, why = pod["metadata"]["uid"], say.unfit(pod, self.labels, self.capacity, running)
            if why is None and self._bind(pod):
                running.append(pod)
            elif why is not None and self._unschedulable.get(uid) != why:
                self._unschedulable[uid] = why
                self._patch_status(pod, say.unschedulable(why))

    def _bind(self, pod: dict) -> bool:
        meta = pod["metadata"]
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=meta["name"], uid=meta["uid"]),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        # Raw (in _call): the typed client cannot parse the Status a 1.20 server answers.
        bind = self._core.create_namespaced_pod_binding
        if not self._call(bind, meta["name"], meta["namespace"], binding):
            return False
        pod["spec"]["nodeName"] = self.node_name  # before the watch says so
        self._unschedulable.pop(meta["uid"], None)
        return True

    # --- running -----------------------------------------------------------------------

    def _start(self, pod: dict) -> None:
        meta = pod["metadata"]
        name = f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        run = _Run(pod, self.logs_dir / f"{name}.log", self.pods_dir / meta["uid"])
        run.log.touch()
        self._runs[meta["uid"]] = self._latest[run.key] = run
        self._all_runs.append(run)
        self._launch(run)

    def _launch(self, run: _Run) -> None:
        """Start the pod's process; or report why it cannot start yet and try again soon,
        as a kubelet does (a missing Secret or ConfigMap may yet be made)."""
        if run.deleting or self._stopping.is_set():
            return
        container = run.pod["spec"]["containers"][0]
        image = container["image"]
        if image in self.missing_images or image.startswith("missing/"):
            return self._retry(run, say.pull_failure(image, first=run.waiting is None))
        try:
            ip = self._pod_ip(run.pod)
            port = urlparse(self.cluster.server).port
            argv, env = box.prepare(self._core, run.pod, ip, port, run.dir)
        except box.ContainerConfigError as err:
            return self._retry(run, {"reason": "CreateContainerConfigError", "message": str(err)})
        except Exception as err:  # e.g. the API server out of reach
            return self._retry(run, {"reason": "CreateContainerError", "message": repr(err)})
        with self._lock, run.log.open("ab") as out:
            if run.deleting or self._stopping.is_set():
                return
            run.ip, run.started = ip, say.now()
            # A session of its own: one process group to signal, like a container's.
            run.proc = subprocess.Popen(
                argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self._report(run, "Running", {"running": {"startedAt": run.started}})
        threading.Thread(target=self._wait, args=(run,), name=f"pod {run.key}", daemon=True).start()

    def _retry(self, run: _Run, waiting: dict) -> None:
        if waiting != run.waiting:  # each change once
            run.waiting = waiting
            self._report(run, "Pending", {"waiting": waiting})
        timer = threading.Timer(RETRY_SECONDS, self._launch, (run,))
        timer.daemon = True
        timer.start()

    def _pod_ip(self, pod: dict) -> str:
        """The cluster IP of the one Service selecting the pod, or an address of its own."""
        labels = pod["metadata"].get("labels") or {}
        got = self._core.list_namespaced_service(
            pod["metadata"]["namespace"], _preload_content=False
        )
        ips = [
            s["spec"]["clusterIP"]
            for s in json.loads(got.data)["items"]
            if s["spec"].get("selector")
            and s["spec"].get("clusterIP") not in (None, "", "None")
            and s["spec"]["selector"].items() <= labels.items()
        ]
        if len(ips) == 1:
            return ips[0]
        n = next(self._ips)
        return f"127.2.{n // 256}.{n % 256}"

    def _wait(self, run: _Run) -> None:
        """Wait for the pod's process, report how it ended, then finish a deletion."""
        # Not reaped yet (WNOWAIT), its pid and so its process group cannot be reused while
        # the group's other processes are killed (a container's processes die with it).
        os.waitid(os.P_PID, run.proc.pid, os.WEXITED | os.WNOWAIT)
        self._signal(run, signal.SIGKILL)
        code = run.proc.wait()
        run.exited.set()
        if self._stopping.is_set():
            return
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N
        message = box.termination_message(run.pod, run.dir, run.log, code)
        state = say.terminated(code, run.oom, run.started, message)
        phase = "Succeeded" if code == 0 and not (run.oom or run.evicted) else "Failed"
        self._report(run, phase, state, **(say.EVICTED if run.evicted else {}))
        with self._lock:
            run.done = True
            finish = run.deleting
        if finish:
            self._finalize(run.pod)

    @staticmethod
    def _signal(run: _Run, signum: int) -> None:
        if run.proc is not None and run.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signum)

    def _report(self, run: _Run, phase: str, state: dict, **pod_status) -> None:
        pid = run.proc.pid if run.proc else None
        status = say.pod_status(run.pod, phase, state, run.ip, run.started, pid)
        self._patch_status(run.pod, status | pod_status)

    # --- deletion ----------------------------------------------------------------------

    def _terminate(self, pod: dict) -> None:
        """A pod being deleted: stop its process, then confirm the deletion."""
        run = self._runs.get(pod["metadata"]["uid"])
        if run is None:  # bound here but never seen: nothing to stop
            return self._finalize(pod)
        with self._lock:
            if run.deleting:
                return
            run.deleting = True
            finish = run.proc is None or run.done
        if finish:
            return self._finalize(pod)
        grace = min(pod["metadata"].get("deletionGracePeriodSeconds") or 0, MAX_GRACE_SECONDS)
        threading.Thread(target=self._kill, args=(run, grace), daemon=True).start()

    def _kill(self, run: _Run, grace: float) -> None:
        self._signal(run, signal.SIGTERM)
        if not run.exited.wait(grace):
            self._signal(run, signal.SIGKILL)

    def _finalize(self, pod: dict) -> None:
        """Delete for good: the API server keeps a pod bound to a node until its kubelet
        says its containers are gone."""
        meta = pod["metadata"]
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        self._call(self._core.delete_namespaced_pod, meta["name"], meta["namespace"], body=options)

    def _forget(self, uid: str) -> None:
        """The pod is gone: its process goes at once."""
        self._pods.pop(uid, None)
        self._unschedulable.pop(uid, None)
        run = self._runs.pop(uid, None)
        if run is not None:
            with self._lock:
                run.deleting = True
            self._signal(run, signal.SIGKILL)
