"""A local port that reaches a pod's port through the API server (`kubectl
port-forward`, in-process): how a notebook outside the cluster talks to its job's master.

gRPC needs a TCP address to dial, so this listens on loopback and, for each connection
gRPC makes, opens one port-forward stream to the pod (the `kubernetes` client's
websocket PortForward) and copies bytes both ways until either side closes.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

log = logging.getLogger("elasticdl_nb.kubernetes")

StreamOpener = Callable[[], socket.socket]  # a connected socket-like object to the pod


def pod_stream_opener(api, pod: str | Callable[[], str], namespace: str, port: int) -> StreamOpener:
    """Opens a port-forward stream to `pod`:`port` through `api` (a CoreV1Api). `pod`
    may be a function that names the pod at each opening (a job's master pod, which is
    replaced under a new name).

    `api` must serve port-forwards only: while a stream opens, the `kubernetes` client
    routes every call of its ApiClient through the websocket (a call from another thread
    then fails with "Missing required parameter `ports`"), so openings take turns."""
    opening = threading.Lock()

    def open_stream():
        from kubernetes.stream import portforward

        name = pod() if callable(pod) else pod
        with opening:
            forward = portforward(
                api.connect_get_namespaced_pod_portforward, name, namespace, ports=str(port)
            )
        return forward.socket(port)

    return open_stream


class PortForward:
    def __init__(self, open_stream: StreamOpener):
        self._open_stream = open_stream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        self.failure = ""  # why the last stream could not be opened ('' once one opens)
        threading.Thread(target=self._accept, daemon=True, name="port-forward").start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                remote = self._open_stream()
            except Exception as exc:  # the API server refused or is out of reach
                self.failure = f"{type(exc).__name__}: {exc}".strip()
                log.warning("port-forward to the master failed: %s", self.failure)
                local.close()
                continue
            self.failure = ""
            for source, sink in ((local, remote), (remote, local)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source, sink) -> None:
    """Copy bytes from source to sink until source ends; then end sink's sending side."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            sink.close()
