"""The bulk channel: every PushPull of a training step, with large tensors as raw bytes
beside the message.

Two costs of gRPC made its own channel worth it. gRPC Python and protobuf copy a large
tensor five or six times per direction (tobytes, the message field, serialization, gRPC's
send and its slice-by-slice receive, parsing), which kept a 64 MiB transfer far below what
the socket can do; and a small call costs ~0.3 ms of CPU on each side (its threads,
completion queue and interceptors), as much as a PS's whole update of a CTR minibatch. On
this channel a call is one framed write and one read on a persistent connection; the
message carries the small fields and each large tensor is marked out of band
(`Tensor.out_of_band`, see tensors.py): its bytes follow the message, sent straight from
the array's memory and received into buffers that the arrays are then built on.

A PS listens on a TCP port of its own host (`bulk_server.py`); a worker learns the port
with the GetBulkEndpoint RPC. The wire format is frames.py's: a TLS session when the job
has one, a token handshake, then frames. A request frame carries a serialized
PushPullRequest, a reply frame a PushPullResponse, an error frame (kind 1)
"<grpc status code name>\\n<details>" in UTF-8. Failures surface as `BulkError`, a
`grpc.RpcError` with the status codes gRPC would give, so callers handle both transports
alike.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence

import grpc
import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.frames import ERROR, connect, greet, recv_frame, send_frame
from elasticdl_nb.runtime.protocol.tls import JobTls


class BulkError(grpc.RpcError):
    """A failed bulk exchange, with the status code gRPC would have given."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def error_message(code: grpc.StatusCode, details: str) -> bytes:
    return f"{code.name}\n{details}".encode()


def parse_error(message: bytes) -> BulkError:
    name, _, details = bytes(message).decode(errors="replace").partition("\n")
    return BulkError(getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN), details)


# ---------------------------------------------------------------------------- client


class BulkClient:
    """PushPull on one PS's bulk channel: a persistent connection per calling thread,
    opened on first use and dropped on any failure (the next call reconnects, asking the
    PS for its port again: a relaunched PS listens on another one)."""

    def __init__(
        self,
        host: str,
        token: str,
        peer: str,
        find_port: Callable[[], int],
        timeout: float = 60.0,
        tls: JobTls | None = None,
    ):
        self.host, self.timeout = host, timeout
        self._token, self._peer, self._tls = token, peer, tls
        self._find_port = find_port  # may raise grpc.RpcError: it is a gRPC call
        self._port: int | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def push_pull(
        self, request: pb.PushPullRequest, buffers: Sequence[np.ndarray] = ()
    ) -> tuple[pb.PushPullResponse, list[np.ndarray]]:
        """Send `request` with its out-of-band `buffers`; (reply, reply's buffers)."""
        sock = self._connection()
        try:
            send_frame(sock, request.SerializeToString(), buffers)
            kind, message, inbound = recv_frame(sock, self.timeout, self.timeout)
        except TimeoutError as err:
            self._drop(sock)
            raise BulkError(grpc.StatusCode.DEADLINE_EXCEEDED, f"bulk exchange: {err}") from err
        except OSError as err:  # FrameError included
            self._drop(sock)
            raise BulkError(grpc.StatusCode.UNAVAILABLE, f"bulk exchange: {err}") from err
        if kind == ERROR:
            raise parse_error(message)
        return pb.PushPullResponse.FromString(message), inbound

    def _connection(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            return sock
        if self._port is None:
            self._port = self._find_port()
        try:
            sock = connect(self.host, self._port, self.timeout, self._tls, self._peer)
        except OSError as err:  # refused, or (TLS) not this job's `peer`
            self._port = None
            raise BulkError(
                grpc.StatusCode.UNAVAILABLE, f"bulk connect to {self.host}: {err}"
            ) from err
        try:
            greet(sock, self._token, self._peer)
        except OSError as err:
            sock.close()
            self._port = None
            raise BulkError(
                grpc.StatusCode.UNAVAILABLE, f"bulk channel did not accept us: {err}"
            ) from err
        self._local.sock = sock
        with self._lock:
            self._open.add(sock)
        return sock

    def _drop(self, sock: socket.socket) -> None:
        self._local.sock = None
        self._port = None
        with self._lock:
            self._open.discard(sock)
        sock.close()

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            socks, self._open = self._open, set()
        for sock in socks:
            sock.close()
