"""Frames on a TCP socket between a job's processes: a token handshake, then messages
with raw tensor buffers beside them. The PS's bulk channel (bulk.py) and the workers'
collective ring (runtime/collective/) both speak it, in plaintext or, when the job has
TLS, inside a mutual TLS session (`connect`, `secure_accepted`; tls.py) that starts before
the hello. Integers are big-endian:

    hello  (client, once per connection)  b"EDLBULK1", u16 length, token NUL listener name
    ready  (server, once)                 b"\\x01" (on a wrong token or another listener's
                                          name: the server closes)
    frame  (either way, repeatedly)       u8 kind, u32 message bytes, u32 buffer count,
                                          u64 length of each buffer, message, buffers

The hello names the listener the client means ("ps-0", "worker-3"): a port that changed
hands is never served by the wrong process, even of the same job.

Each buffer's bytes are sent straight from its array's memory and received into a
preallocated array, so a large tensor is copied once per side. Received arrays start on a
64-byte boundary: TensorFlow then makes a tensor of one without copying it (it aliases
aligned NumPy memory and copies the rest), which for a 64 MiB gradient saved ~15 ms of
a ~50 ms push (bench/profiles.md).
"""

from __future__ import annotations

import hmac
import socket
import struct
from collections.abc import Sequence

import numpy as np

from elasticdl_nb.runtime.protocol.channels import MAX_MESSAGE_BYTES, AddressTaken
from elasticdl_nb.runtime.protocol.tensors import as_bytes
from elasticdl_nb.runtime.protocol.tls import JobTls

HELLO = b"EDLBULK1"
READY = b"\x01"
MESSAGE, ERROR = 0, 1
MAX_TOKEN_BYTES = 1024
MAX_BUFFERS = 1 << 16
MAX_BUFFER_BYTES = 1 << 40
TOKEN_LEN = struct.Struct("!H")
_HEAD = struct.Struct("!BII")
# Eigen's largest alignment (AVX-512): TensorFlow aliases NumPy memory aligned to it.
BUFFER_ALIGNMENT = 64


# Connections a listener holds before they are accepted: a thousand workers connect to a
# PS at once (a job starting, a PS coming back), and beyond Python's default of 128 the
# kernel drops their SYNs, which come again a second later (the kernel caps it at its
# net.core.somaxconn).
BACKLOG = 1024


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on `host`, at `port` or one the OS picks, never shared:
    without SO_REUSEPORT, a port another listener holds is an `AddressTaken` error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=BACKLOG, reuse_port=False)
    except OSError as exc:
        raise AddressTaken(f"{host}:{port}", exc.strerror or str(exc)) from None


def connect(
    host: str, port: int, timeout: float, tls: JobTls | None = None, tls_name: str = ""
) -> socket.socket:
    """A connection to a listener at host:port, with Nagle off (a frame is written whole
    already); with `tls`, after a TLS handshake with a server that shows `tls_name`'s
    certificate of this job. OSError (ssl.SSLError included) if either fails."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock if tls is None else tls.client_socket(sock, tls_name)
    except BaseException:
        sock.close()
        raise


def secure_accepted(conn: socket.socket, tls: JobTls | None) -> socket.socket:
    """An accepted connection, after the TLS handshake when there is `tls` (ssl.SSLError
    for a client without a certificate of this job). Set its timeout first."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn if tls is None else tls.server_socket(conn)


class FrameError(ConnectionError):
    """The peer closed the connection or sent something that is not a frame."""


def hello(token: str, peer: str) -> bytes:
    """What a client sends first: proof that it holds the job token, and the name of the
    listener it means to reach."""
    secret = _secret(token, peer)
    return HELLO + TOKEN_LEN.pack(len(secret)) + secret


def _secret(token: str, name: str) -> bytes:
    return f"{token}\0{name}".encode()


def greet(sock: socket.socket, token: str, peer: str) -> None:
    """Client side of the handshake: send the hello, wait for ready (OSError if refused)."""
    sock.sendall(hello(token, peer))
    recv_exact(sock, memoryview(bytearray(len(READY))))


def accept_hello(conn: socket.socket, token: str, identity: str) -> bool:
    """Server side: whether the peer's hello carries `token` and names this listener,
    `identity` (compared in constant time). The caller sends READY if so, and closes the
    connection if not."""
    first = recv_bytes(conn, len(HELLO) + TOKEN_LEN.size)
    (size,) = TOKEN_LEN.unpack(first[len(HELLO) :])
    if first[: len(HELLO)] != HELLO or size > MAX_TOKEN_BYTES:
        return False
    return hmac.compare_digest(bytes(recv_bytes(conn, size)), _secret(token, identity))


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
        buffers.append(aligned_buffer(n))
        recv_exact(sock, memoryview(buffers[-1]))
    return kind, message, buffers


def aligned_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` whose first byte is `BUFFER_ALIGNMENT`-
    aligned (malloc only promises 16)."""
    raw = np.empty(nbytes + BUFFER_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % BUFFER_ALIGNMENT
    return raw[start : start + nbytes]
