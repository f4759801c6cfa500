"""Follow a job's pods through the API server, through anything the server does.

A list gives every pod and a resourceVersion; a watch from that version gives every change
after it. When the connection drops (the server restarting), the watch resumes from the
last version it saw, with backoff; when the server no longer has that version (410 Gone,
after a compaction or a restart), it starts over from a fresh list, and a pod that the
new list lacks was deleted meanwhile, which is reported as such. Each pod state reaches
`on_pod(pod, deleted)` as a plain dict (the API's JSON), in order, at least once;
consumers keep only what changed.

A consumer that must see the pods as they are before anything else (a master taking a job
over) lists them itself (`list_pods`) and starts the watch from that list's version: every
change after it comes once, none before it twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("elasticdl_nb.kubernetes")

PodCallback = Callable[[dict[str, Any], bool], None]


class PodWatch:
    def __init__(
        self,
        api,  # kubernetes.client.CoreV1Api
        namespace: str,
        selector: str,
        on_pod: PodCallback,
        watch_seconds: int = 60,
    ):
        self.api, self.namespace, self.selector = api, namespace, selector
        self.on_pod = on_pod
        self.watch_seconds = watch_seconds  # a server-side timeout: reconnect this often
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self.relists = 0  # how often it had to start over from a list (410 Gone)
        self.reconnects = 0  # how often the connection broke and the watch resumed
        self._alive: dict[str, dict[str, Any]] = {}  # uid -> last state of a live pod
        self._version: str | None = None  # where the watch starts (None: a fresh list)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self, version: str | None = None) -> PodWatch:
        """Follow the pods from `version` (what `list_pods` returned), else from a fresh list
        whose pods all go to `on_pod`."""
        self._version = version
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        """Every pod now, and the version to `start` from. They are not passed to
        `on_pod` (the caller handles them), but count as seen: one that a later re-list
        lacks is reported deleted."""
        body = _json(
            self.api.list_namespaced_pod(
                self.namespace, label_selector=self.selector, _preload_content=False
            )
        )
        pods = body.get("items", [])
        self._alive = {pod["metadata"]["uid"]: pod for pod in pods}
        return pods, body["metadata"]["resourceVersion"]

    def _run(self) -> None:
        backoff = 0.2
        version = self._version
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                backoff = 0.2
            except _Gone:
                log.info("pod watch: resourceVersion %s is gone; listing again", version)
                version = None
            except Exception as exc:  # the API server restarting, a dropped connection
                log.warning("pod watch: %s; resuming in %.1f s", exc, backoff)
                self.reconnects += 1
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _list(self) -> str:
        self.relists += 1
        pods = self.api.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False
        )
        body = _json(pods)
        listed = {pod["metadata"]["uid"] for pod in body.get("items", [])}
        for uid, pod in list(self._alive.items()):
            if uid not in listed:  # deleted while we were not watching
                self._seen(pod, deleted=True)
        for pod in body.get("items", []):
            self._seen(pod, deleted=False)
        return body["metadata"]["resourceVersion"]

    def _seen(self, pod: dict[str, Any], deleted: bool) -> None:
        uid = pod.get("metadata", {}).get("uid", "")
        if deleted:
            self._alive.pop(uid, None)
        else:
            self._alive[uid] = pod
        self.on_pod(pod, deleted)

    def _watch(self, version: str) -> str:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        stream = watch.Watch()
        try:
            # With a timeout the client does not retry on its own: an expired version
            # (410) comes back as an ApiException, handled by listing again.
            for change in stream.stream(
                self.api.list_namespaced_pod,
                self.namespace,
                label_selector=self.selector,
                resource_version=version,
                timeout_seconds=self.watch_seconds,
                allow_watch_bookmarks=True,
            ):
                if self._stop.is_set():
                    break
                pod, kind = change["raw_object"], change["type"]
                version = pod.get("metadata", {}).get("resourceVersion", version)
                if kind != "BOOKMARK":
                    self._seen(pod, kind == "DELETED")
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        finally:
            stream.stop()
        return version


class _Gone(Exception):
    """The watch's resourceVersion is too old for the server: list again."""


def _json(response) -> dict[str, Any]:
    import json

    return json.loads(response.data)
