"""The per-job token on every RPC: a server interceptor that refuses calls without it,
and a client interceptor that adds it.

The token travels in the `authorization` metadata as `Bearer <token>`. Processes of a job
get it from the environment variable `ELASTICDL_NB_TOKEN`, never from the command line
(which any local user can read with `ps`).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Any

import grpc

TOKEN_ENV = "ELASTICDL_NB_TOKEN"
_HEADER = "authorization"


def token_from_env() -> str:
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise SystemExit(f"{TOKEN_ENV} is not set: job processes need the job's token")
    return token


class TokenCheck(grpc.ServerInterceptor):
    """Rejects every call whose metadata lacks the job's token (UNAUTHENTICATED)."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

        def refuse(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")

        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        for key, value in details.invocation_metadata or ():
            if key == _HEADER:
                given = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(given, self._expected):
                    return continuation(details)
        return self._refusal


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]):
        self.method = base.method
        self.timeout = base.timeout
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression
        self.metadata = metadata


class TokenAdder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the job's token to every outgoing call."""

    def __init__(self, token: str):
        self._pair = (_HEADER, f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _ClientCallDetails(details, [*(details.metadata or ()), self._pair])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)
