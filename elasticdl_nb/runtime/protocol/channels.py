"""Channels and servers with the job's settings: token, peer names, TLS when the job has
it (tls.py: mutual, the server checked against the name meant), message size,
keepalive, and ports that are never shared.

Parameter tensors can be large, so the message limit is raised deliberately to
`MAX_MESSAGE_BYTES` on both ends instead of gRPC's 4 MB default.

A server binds its own port and reports the one it got (`listen`): nothing picks a free
port to bind later. gRPC sets SO_REUSEPORT on its listeners on Linux by default, so a
second server on a port that one of ours already holds would bind without complaint and
the kernel would split the connections between the two; ours turn it off, and a port
that is taken is an `AddressTaken` error.
"""

from __future__ import annotations

from concurrent import futures

import grpc

from elasticdl_nb.runtime.protocol.auth import TokenAdder, TokenCheck
from elasticdl_nb.runtime.protocol.patience import Patience, PatientCalls
from elasticdl_nb.runtime.protocol.server_load import ServerLoad
from elasticdl_nb.runtime.protocol.tls import JobTls

MAX_MESSAGE_BYTES = 512 * 1024 * 1024

CLIENT_OPTIONS = [  # (also a benchmark's own asyncio channels: bench/simulated_workers.py)
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Fail fast on a dead peer and reconnect quickly when it comes back at the same
    # address (a relaunched PS), instead of gRPC's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]
_SERVER_OPTIONS = [*CLIENT_OPTIONS, ("grpc.so_reuseport", 0)]


class AddressTaken(OSError):
    """A server could not bind its address: something else listens there."""

    def __init__(self, address: str, detail: str):
        super().__init__(
            f"cannot listen on {address}: the address is in use or not on this host "
            f"({detail}). Another process holds the port; a job's servers bind the ports "
            "the OS gives them, so this is a port fixed in the job's settings or a server "
            "that is still running."
        )


def open_channel(
    address: str,
    token: str,
    peer: str,
    patience: Patience | None = None,
    tls: JobTls | None = None,
) -> grpc.Channel:
    """A channel to the server named `peer` ("master", "ps-0") at `address`, sending the
    job token on every call; with `patience`, unary calls ride out transient failures
    (protocol/patience.py); with `tls`, over mutual TLS to a server that shows `peer`'s
    certificate of this job (else plaintext)."""
    interceptors: list = [TokenAdder(token, peer)]
    if patience is not None:
        interceptors.append(PatientCalls(peer, address, patience))
    if tls is None:
        channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
    else:
        options = CLIENT_OPTIONS + tls.channel_options(peer)
        channel = grpc.secure_channel(address, tls.channel_credentials(), options=options)
    return grpc.intercept_channel(channel, *interceptors)


def make_server(
    token: str, identity: str, threads: int = 16, load: ServerLoad | None = None
) -> grpc.Server:
    """A server named `identity` that refuses calls without the job token or meant for
    another server; add servicers, then `listen`. With `load`, it holds at most
    `load.max_calls` calls at once and counts them (server_load.py): its threads are
    `load`'s (`threads` is then `load.threads`)."""
    check = TokenCheck(token, identity)
    return grpc.server(
        load.pool if load else futures.ThreadPoolExecutor(max_workers=threads),
        interceptors=[load, check] if load else [check],
        options=_SERVER_OPTIONS,
        maximum_concurrent_rpcs=load.max_calls if load else None,
    )


def listen(server: grpc.Server, address: str, tls: JobTls | None = None) -> int:
    """Bind `server` to "host:port" (port 0: one the OS picks), serving mutual TLS with
    `tls` (else plaintext); returns the port bound."""
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError as exc:  # grpcio raises "Failed to bind to address ..."
        raise AddressTaken(address, str(exc)) from None
    if not port:  # older grpcio returns 0 instead
        raise AddressTaken(address, "bind failed")
    return port


def host_of(address: str) -> str:
    """The host part of "host:port" (brackets of an IPv6 literal removed)."""
    return address.rsplit(":", 1)[0].strip("[]")
