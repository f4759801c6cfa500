"""Channels and servers with the job's settings: token, message size, keepalive.

Parameter tensors can be large, so the message limit is raised deliberately to
`MAX_MESSAGE_BYTES` on both ends instead of gRPC's 4 MB default.
"""

from __future__ import annotations

from concurrent import futures

import grpc

from elasticdl_nb.runtime.protocol.auth import TokenAdder, TokenCheck

MAX_MESSAGE_BYTES = 512 * 1024 * 1024

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Fail fast on a dead peer and reconnect quickly when it comes back at the same
    # address (a relaunched PS), instead of gRPC's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


def open_channel(address: str, token: str) -> grpc.Channel:
    """An insecure channel to `address` that sends the job token on every call."""
    return grpc.intercept_channel(
        grpc.insecure_channel(address, options=_OPTIONS), TokenAdder(token)
    )


def make_server(token: str, threads: int = 16) -> grpc.Server:
    """A server that refuses calls without the job token; add servicers, then bind."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads),
        interceptors=[TokenCheck(token)],
        options=_OPTIONS,
        maximum_concurrent_rpcs=None,
    )


def host_of(address: str) -> str:
    """The host part of "host:port" (brackets of an IPv6 literal removed)."""
    return address.rsplit(":", 1)[0].strip("[]")
