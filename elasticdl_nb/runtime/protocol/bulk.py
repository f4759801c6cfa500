"""The bulk channel: PushPull with large tensors as raw bytes beside the message.

gRPC Python and protobuf copy a large tensor five or six times per direction (tobytes,
the message field, serialization, gRPC's send and its slice-by-slice receive, parsing),
which keeps a 64 MiB transfer far below what the socket can do. On this channel the
message carries only the small fields; each large tensor is marked out of band
(`Tensor.out_of_band`, see tensors.py) and its bytes follow the message, sent straight
from the array's memory and received into preallocated buffers that the arrays are then
built on.

A PS listens on a TCP port of its own host (`bulk_server.py`); a worker learns the port
with the GetBulkEndpoint RPC. Wire format, all integers big-endian:

    hello  (client, once per connection)  b"EDLBULK1", u16 token length, token bytes
    ready  (server, once)                 b"\\x01" (on a wrong token: the server closes)
    frame  (either way, repeatedly)       u8 kind, u32 message bytes, u32 buffer count,
                                          u64 length of each buffer, message, buffers

A request frame carries a serialized PushPullRequest, a reply frame a PushPullResponse,
an error frame (kind 1) "<grpc status code name>\\n<details>" in UTF-8. Failures surface
as `BulkError`, a `grpc.RpcError` with the status codes gRPC would give, so callers
handle both transports alike.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Sequence

import grpc
import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.channels import MAX_MESSAGE_BYTES
from elasticdl_nb.runtime.protocol.tensors import as_bytes

HELLO = b"EDLBULK1"
READY = b"\x01"
MESSAGE, ERROR = 0, 1
MAX_TOKEN_BYTES = 1024
MAX_BUFFERS = 1 << 16
MAX_BUFFER_BYTES = 1 << 40
TOKEN_LEN = struct.Struct("!H")
_HEAD = struct.Struct("!BII")


class FrameError(ConnectionError):
    """The peer closed the connection or sent something that is not a frame."""


class BulkError(grpc.RpcError):
    """A failed bulk exchange, with the status code gRPC would have given."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# ---------------------------------------------------------------------------- framing


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`; FrameError if the peer closes first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise FrameError(f"peer closed the connection after {got} of {len(view)} bytes")
        got += n


def recv_bytes(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    recv_exact(sock, memoryview(buf))
    return buf


def send_frame(
    sock: socket.socket, message: bytes, buffers: Sequence[np.ndarray] = (), kind: int = MESSAGE
) -> None:
    """One frame: header, buffer lengths and message in one write, then each buffer's
    bytes straight from its (C-contiguous) array."""
    lengths = struct.pack(f"!{len(buffers)}Q", *(b.nbytes for b in buffers))
    sock.sendall(b"".join((_HEAD.pack(kind, len(message), len(buffers)), lengths, message)))
    for array in buffers:
        if array.nbytes:
            sock.sendall(as_bytes(array))


def recv_frame(
    sock: socket.socket, idle_timeout: float | None, timeout: float | None
) -> tuple[int, bytearray, list[np.ndarray]]:
    """(kind, message, buffers) of the next frame. Waits up to `idle_timeout` for it to
    begin (None: forever), then up to `timeout` for each read of the rest."""
    head = memoryview(bytearray(_HEAD.size))
    sock.settimeout(idle_timeout)
    recv_exact(sock, head[:1])
    sock.settimeout(timeout)
    recv_exact(sock, head[1:])
    kind, size, count = _HEAD.unpack(head)
    if kind not in (MESSAGE, ERROR) or size > MAX_MESSAGE_BYTES or count > MAX_BUFFERS:
        raise FrameError(f"not a frame: kind {kind}, {size} bytes, {count} buffers")
    lengths = struct.unpack(f"!{count}Q", recv_bytes(sock, 8 * count))
    if any(n > MAX_BUFFER_BYTES for n in lengths):
        raise FrameError(f"buffer of {max(lengths)} bytes announced")
    message = recv_bytes(sock, size)
    buffers = []
    for n in lengths:
        buffers.append(np.empty(n, np.uint8))
        recv_exact(sock, memoryview(buffers[-1]))
    return kind, message, buffers


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

    def __init__(self, host: str, token: str, find_port: Callable[[], int], timeout: float = 60.0):
        self.host, self.timeout = host, timeout
        self._hello = HELLO + TOKEN_LEN.pack(len(token.encode())) + token.encode()
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
            sock = socket.create_connection((self.host, self._port), timeout=self.timeout)
        except OSError as err:
            self._port = None
            raise BulkError(
                grpc.StatusCode.UNAVAILABLE, f"bulk connect to {self.host}: {err}"
            ) from err
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(self._hello)
            recv_exact(sock, memoryview(bytearray(len(READY))))
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
