"""Calls that ride out a busy or briefly unreachable peer, and stop at a stated deadline.

A loaded machine is normal: a master that is paused for a few seconds, a connection
refused while a server starts, a reply that misses its timeout, a server that holds as
many calls as it takes and turns the next away (server_load.py). One such failure must
not end a process. A channel opened with a `Patience` retries every unary call that
failed transiently (`transient`: UNAVAILABLE, DEADLINE_EXCEEDED, or a server's "busy"),
with backoff, until `seconds` have passed since the first attempt; then it raises
`PeerUnreachable`, naming the peer, its address and how long it tried. Only idempotent
calls go over such channels: the Master's GetTask and ReportProgress carry sequence
numbers so that a repeated one is answered, not done twice.

A peer that answers but is not the one we mean (another job's server refuses our token,
another server of this job says who it is, something else has no such method) is not
transient: `WrongPeer` at once, with what the peer said. Those are the errors a process
turns into its "wrong peer" exit code (`runtime/exit_codes.py`), on which the master ends
the job with the reason instead of relaunching into the same wall.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from elasticdl_nb.runtime.protocol.server_load import BUSY_DETAILS

log = logging.getLogger("elasticdl_nb.rpc")

TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def transient(outcome: grpc.Call | grpc.RpcError) -> bool:
    """Whether a call that ended so may succeed if tried again: the transport's codes,
    or a server that was busy (RESOURCE_EXHAUSTED also means a message too large, which
    no retry mends: gRPC's words tell the two apart)."""
    code = outcome.code()
    return code in TRANSIENT or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and outcome.details() == BUSY_DETAILS
    )


MISDIRECTED = {
    grpc.StatusCode.UNAUTHENTICATED: "refused this job's token: it is not a server of this job",
    grpc.StatusCode.PERMISSION_DENIED: "is another server of this job",
    grpc.StatusCode.UNIMPLEMENTED: "does not serve this call: it is not a server of this job",
}


class PeerUnreachable(ConnectionError):
    """A peer did not answer within the patience of the channel."""


class WrongPeer(ConnectionError):
    """The address of a peer is served by something else."""


def wrong_peer(err: grpc.RpcError, peer: str, address: str) -> WrongPeer | None:
    """The `WrongPeer` that `err` means, or None if it means something else."""
    what = MISDIRECTED.get(err.code())
    if what is None:
        return None
    return WrongPeer(f"the {peer} at {address} {what} ({err.code().name}: {err.details()})")


@dataclass(frozen=True)
class Patience:
    """How long to keep trying a peer, and how quickly to try again."""

    seconds: float
    first_delay: float = 0.1
    max_delay: float = 2.0


class Backoff:
    """One run of tries under a `Patience`: `wait()` sleeps before the next try, unless
    that try would come after the deadline (`exhausted`)."""

    def __init__(self, patience: Patience):
        self.patience = patience
        self.started = time.monotonic()
        self.delay = patience.first_delay

    @property
    def waited(self) -> float:
        return time.monotonic() - self.started

    @property
    def exhausted(self) -> bool:
        return self.waited + self.delay > self.patience.seconds

    def wait(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.patience.max_delay)


class PatientCalls(grpc.UnaryUnaryClientInterceptor):
    """Retries transient failures of every unary call (see the module docstring)."""

    def __init__(self, peer: str, address: str, patience: Patience):
        self.peer, self.address, self.patience = peer, address, patience

    def intercept_unary_unary(self, continuation, client_call_details, request):
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        backoff = Backoff(self.patience)
        while True:
            outcome = continuation(client_call_details, request)
            code = outcome.code()
            if not transient(outcome):
                if isinstance(outcome, grpc.RpcError):
                    misdirected = wrong_peer(outcome, self.peer, self.address)
                    if misdirected is not None:
                        raise misdirected
                return outcome
            if backoff.exhausted:
                raise PeerUnreachable(
                    f"the {self.peer} at {self.address} did not answer "
                    f"{method.rsplit('/', 1)[-1]} for {backoff.waited:.0f} s "
                    f"(limit {self.patience.seconds:g} s): {code.name}: {outcome.details()}"
                )
            log.info(
                "%s at %s: %s on %s; trying again in %.1f s",
                self.peer, self.address, code.name, method, backoff.delay,
            )  # fmt: skip
            backoff.wait()
