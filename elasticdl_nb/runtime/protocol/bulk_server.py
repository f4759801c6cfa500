"""The PS's end of the bulk channel (wire format in bulk.py): a TCP listener beside the
gRPC server, each accepted connection served on its own thread once it has shown the job
token (inside a TLS session whose client showed this job's certificate, when the job has
TLS), every request handed to the same PushPull logic the gRPC handler uses.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence

import grpc
import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.bulk import BulkError, error_message
from elasticdl_nb.runtime.protocol.frames import (
    ERROR,
    MESSAGE,
    READY,
    accept_hello,
    listen_socket,
    recv_frame,
    secure_accepted,
    send_frame,
)
from elasticdl_nb.runtime.protocol.tls import JobTls

log = logging.getLogger("elasticdl_nb.bulk")

KEEPALIVE_IDLE_SECONDS = 30  # then a probe every 10 s, 3 unanswered: the peer is gone

# (request, its buffers) -> (reply, the reply's out-of-band buffers). Raises BulkError to
# refuse the request with a status code; any other exception is reported as UNKNOWN.
Handler = Callable[
    [pb.PushPullRequest, Sequence[np.ndarray]], tuple[pb.PushPullResponse, list[np.ndarray]]
]


class BulkServer:
    """Serves bulk PushPull on `host`, on `port` or one the OS chooses (`.port`), to
    clients that hold the job token and mean this server, `identity` ("ps-0")."""

    def __init__(
        self,
        host: str,
        token: str,
        identity: str,
        handle: Handler,
        port: int = 0,
        timeout: float = 60.0,
        tls: JobTls | None = None,
    ):
        self._token, self._identity, self._tls = token, identity, tls
        self._handle, self._timeout = handle, timeout
        self._listener = listen_socket(host, port)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stopped = False

    def start(self) -> BulkServer:
        threading.Thread(target=self._accept_loop, daemon=True, name="bulk-accept").start()
        return self

    def stop(self) -> None:
        """Stop accepting and cut every open connection (their threads then end)."""
        with self._lock:
            self._stopped = True
            conns, self._conns = self._conns, set()
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn, peer), daemon=True, name=f"bulk-{peer}"
            ).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        try:
            # A connection idle between frames waits for the next one without a timeout;
            # the kernel's probes end it within a minute once the worker is gone or its
            # end was reset (the kernel's default: after 2 h), so that no thread waits
            # for ever on a connection nobody holds.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_SECONDS)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            conn.settimeout(self._timeout)
            try:
                conn = self._secured(conn)
            except OSError as err:
                log.warning("bulk connection from %s refused at the TLS handshake: %s", peer, err)
                return
            if not accept_hello(conn, self._token, self._identity):
                log.warning(
                    "bulk connection from %s refused: wrong job token or not for %s",
                    peer,
                    self._identity,
                )
                return
            conn.sendall(READY)
            while True:
                kind, message, buffers = recv_frame(conn, None, self._timeout)
                if kind != MESSAGE:
                    log.warning("bulk connection from %s: unexpected frame kind %d", peer, kind)
                    return
                self._reply(conn, message, buffers)
        except OSError as err:  # the peer left (or stop()): nothing to answer
            log.debug("bulk connection from %s closed: %s", peer, err)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _secured(self, conn: socket.socket) -> socket.socket:
        """`conn` after the TLS handshake (if the job has TLS), in place of the plain
        one in the set `stop` cuts."""
        secure = secure_accepted(conn, self._tls)
        if secure is not conn:
            with self._lock:
                self._conns.discard(conn)
                if self._stopped:
                    secure.close()
                    raise ConnectionAbortedError("the bulk server stopped")
                self._conns.add(secure)
        return secure

    def _reply(self, conn: socket.socket, message: bytearray, buffers: list[np.ndarray]) -> None:
        try:
            reply, out = self._handle(pb.PushPullRequest.FromString(message), buffers)
        except BulkError as err:
            send_frame(conn, error_message(err.code(), err.details()), kind=ERROR)
            return
        except Exception as err:  # what gRPC reports as UNKNOWN for a failing handler
            log.exception("bulk PushPull failed")
            send_frame(conn, error_message(grpc.StatusCode.UNKNOWN, repr(err)), kind=ERROR)
            return
        send_frame(conn, reply.SerializeToString(), out)
