"""The per-job token and the peer's name on every RPC: a server interceptor that refuses
calls without the token or meant for another server, and a client interceptor that adds
both.

The token travels in the `authorization` metadata as `Bearer <token>`. Processes of a job
get it from the environment variable `ELASTICDL_NB_TOKEN`, never from the command line
(which any local user can read with `ps`).

Every server of a job has a name ("master", "ps-0", ...) and every channel names the
server it means to reach. A call that lands on another server of the same job (an
address that changed hands) is refused with PERMISSION_DENIED naming both, instead of
being served by the wrong process; a server of another job refuses the token
(UNAUTHENTICATED); anything else that is not ours answers UNIMPLEMENTED.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Any

import grpc

TOKEN_ENV = "ELASTICDL_NB_TOKEN"
_TOKEN_HEADER = "authorization"
_PEER_HEADER = "elasticdl-peer"  # the name of the server the caller means to reach


def token_from_env() -> str:
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise SystemExit(f"{TOKEN_ENV} is not set: job processes need the job's token")
    return token


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def refuse(request: Any, context: grpc.ServicerContext) -> None:
        context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


class TokenCheck(grpc.ServerInterceptor):
    """Rejects every call whose metadata lacks the job's token (UNAUTHENTICATED), and
    every call meant for a server other than `identity` (PERMISSION_DENIED)."""

    def __init__(self, token: str, identity: str):
        self._expected = f"Bearer {token}".encode()
        self._identity = identity
        self._no_token = _refusal(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        metadata = dict(details.invocation_metadata or ())
        given = metadata.get(_TOKEN_HEADER, "")
        given = given.encode() if isinstance(given, str) else given
        if not hmac.compare_digest(given, self._expected):
            return self._no_token
        meant = metadata.get(_PEER_HEADER, self._identity)
        if meant != self._identity:
            return _refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this is {self._identity} of the job, not {meant}",
            )
        return continuation(details)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]):
        self.method = base.method
        self.timeout = base.timeout
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression
        self.metadata = metadata


class TokenAdder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the job's token, and the name of the server meant (`peer`), to every call."""

    def __init__(self, token: str, peer: str):
        self._pairs = [(_TOKEN_HEADER, f"Bearer {token}"), (_PEER_HEADER, peer)]

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _ClientCallDetails(details, [*(details.metadata or ()), *self._pairs])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)
