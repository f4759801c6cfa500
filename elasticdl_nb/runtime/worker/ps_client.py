"""A worker's view of the parameter servers: one call per shard per step, in parallel.

`exchange` pushes one minibatch's gradients (if any) and pulls what the next step needs
(dense variables if the shard's version moved, rows of the given ids) in one round trip
per shard. Where the shards serve comes from the master (`locate`): a shard that does not
answer is retried with backoff, asking the master again each time, until it is back
(relaunched, on another port or behind the same Service); a shard that came back empty is
initialized again from the local model. Pushes are idempotent: the PS drops a minibatch
it has applied already. A shard's address that answers as something else (another job's
server, another shard) is asked again too, and is `WrongPeer` once the master confirms
that address three times.

Exchanges travel on each shard's bulk channel (protocol/bulk.py: framed messages on a
plain TCP connection, large tensors as raw bytes beside them), gRPC carries the rest
(Init, GetApplied, ...): a gRPC call cost ~0.3 ms of CPU on each side per step, as much
as the PS's whole update (bench/profiles.md). Its failures are `grpc.RpcError`s too,
retried alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np

from elasticdl_nb.runtime.placement import place_dense, rows_on_shard, split_ids
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.bulk import BulkClient
from elasticdl_nb.runtime.protocol.channels import host_of, open_channel
from elasticdl_nb.runtime.protocol.patience import (
    MISDIRECTED,
    Backoff,
    Patience,
    PeerUnreachable,
    wrong_peer,
)
from elasticdl_nb.runtime.protocol.tensors import to_array, to_tensor
from elasticdl_nb.runtime.protocol.tls import JobTls, ps_name
from elasticdl_nb.runtime.table_def import TableDef

log = logging.getLogger("elasticdl_nb.worker")

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}

MISDIRECTED_CONFIRMATIONS = 3  # a wrong answer at an address the master still gives
# An exchange that took this long without failing went unanswered for most of it (a
# shard's reply takes milliseconds; the longest, a 64 MiB pull, well under a second):
# the network dropped it and TCP delivered it late. Told like a failure that healed.
SLOW_EXCHANGE_SECONDS = 10.0

# Told when a shard did not answer: (peer, seconds, healed, what the last call said).
OutageSink = Callable[[str, float, bool, str], None]


@dataclass
class PushPayload:
    epoch: int
    source: int
    batch_start: int
    batch_end: int
    dense: dict[str, np.ndarray]
    tables: dict[str, tuple[np.ndarray, np.ndarray]]
    ledger: bool
    # Synchronous training: per shard, the version the gradients were computed on.
    versions: list[int] | None = None
    learning_rate: float = 0.0  # the task's, set by the master's callbacks (0: none)


@dataclass
class PendingExchange:
    """An exchange on its way: requests sent, replies not yet read."""

    client: PsClient
    requests: list
    futures: list
    pull_ids: dict[str, np.ndarray]
    pull_all: bool
    current_variables: object
    outbound: list  # per shard: the out-of-band arrays of its request
    # Known once `result()` returned: the shards that refused the push as stale
    # (synchronous training), and the learning rate of each shard's newest update.
    stale: list[int] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)

    def result(self):
        """(dense or None, rows), retrying shards that were down. `dense` is given once:
        the shards' versions now count it as held, so later exchanges send it no more.
        The caller puts it into the model (or the model trains on older values and
        says they are these versions)."""
        return self.client._finish_exchange(self)


class PsClient:
    """`locate()` says where each shard serves now ("" for one that is not up); it is
    asked until every shard is up, and again whenever one does not answer. A shard that
    stays unreachable for `give_up_after` seconds is `PeerUnreachable`. Every spell
    in which a shard did not answer (calls failed until one went through, an exchange
    unanswered for SLOW_EXCHANGE_SECONDS, or the end of patience) goes to `on_outage`."""

    def __init__(
        self,
        locate: Callable[[], Sequence[str]],
        token: str,
        give_up_after: float = 600.0,
        tls: JobTls | None = None,
        on_outage: OutageSink | None = None,
    ):
        self._locate, self._token, self._tls = locate, token, tls
        self.give_up_after = give_up_after
        self._on_outage = on_outage
        self._connect_lock = threading.Lock()
        addresses = self._wait_until_up()
        self.num_ps = len(addresses)
        self.addresses = [""] * self.num_ps
        self.stubs: list[rpc.ParameterServerStub] = [None] * self.num_ps  # type: ignore[list-item]
        self.bulk: list[BulkClient] = [None] * self.num_ps  # type: ignore[list-item]
        for ps, address in enumerate(addresses):
            self._connect(ps, address)
        self.versions = [-1] * self.num_ps
        # Per shard: (start, end) of its last exchange on its sender thread, monotonic.
        self._exchanged = [(0.0, 0.0)] * self.num_ps
        self._senders = [
            ThreadPoolExecutor(1, thread_name_prefix=f"ps{i}") for i in range(self.num_ps)
        ]
        self.incarnations = [0] * self.num_ps
        self._variables: list[tuple[str, np.ndarray]] = []
        self.tables: list[TableDef] = []
        self.dense_placement: dict[str, int] = {}
        # The newest dense values of every shard: a shard whose version did not move sends
        # nothing, but the model is loaded whole.
        self.dense_values: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ where the PS are

    def _backoff(self) -> Backoff:
        return Backoff(Patience(self.give_up_after, first_delay=0.05, max_delay=1.0))

    def _wait_until_up(self) -> list[str]:
        backoff = self._backoff()
        while True:
            addresses = list(self._locate())
            if all(addresses):
                return addresses
            if backoff.exhausted:
                down = [ps for ps, a in enumerate(addresses) if not a]
                raise PeerUnreachable(
                    f"PS {down} not up within {self.give_up_after:.0f} s: see their logs"
                )
            backoff.wait()

    def _connect(self, ps: int, address: str) -> None:
        """Talk to shard `ps` at `address` from now on."""
        name = ps_name(ps)
        stub = rpc.ParameterServerStub(open_channel(address, self._token, name, tls=self._tls))
        old = self.bulk[ps]
        self.bulk[ps] = BulkClient(
            host_of(address),
            self._token,
            name,
            lambda: stub.GetBulkEndpoint(pb.Empty(), timeout=10).port,
            tls=self._tls,
        )
        self.stubs[ps], self.addresses[ps] = stub, address
        if old is not None:
            old.close()

    def _relocate(self, ps: int) -> str:
        """Ask the master where shard `ps` is now, and move there if it moved; returns
        that address ("" while the shard is down)."""
        address = list(self._locate())[ps]
        with self._connect_lock:
            if address and address != self.addresses[ps]:
                log.info("PS %d is now at %s (was %s)", ps, address, self.addresses[ps])
                self._connect(ps, address)
        return address

    # ------------------------------------------------------------------ set-up

    def set_model(self, variables: list[tuple[str, np.ndarray]], tables: list[TableDef]) -> None:
        """The model's dense variables (name, initial value) and its embedding tables."""
        self._variables, self.tables = variables, tables
        self.dense_placement = place_dense([(n, v.nbytes) for n, v in variables], self.num_ps)

    def _init_request(self, ps: int, variables, seeds=None) -> pb.InitRequest:
        request = pb.InitRequest(tables=[t.to_json() for t in self.tables])
        for name, value in variables:
            if self.dense_placement[name] == ps:
                request.variables.add(name=name, value=to_tensor(value))
        for name, table in (seeds or {}).items():  # shard `ps` owns ids ps, ps + num_ps, ...
            request.table_seeds.add(name=name, value=to_tensor(table[ps :: self.num_ps]))
        return request

    def initialize(
        self,
        variables: list[tuple[str, np.ndarray]] | None = None,
        seeds: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Offer initial values to every shard (and whole tables to start from, by
        name); a shard keeps the first values it gets."""
        for ps in range(self.num_ps):
            self._call(
                ps,
                lambda stub, p=ps: stub.Init(
                    self._init_request(p, variables or self._variables, seeds), timeout=60
                ),
            )

    def export_tables(self, directory: str) -> None:
        """Have every shard write its rows of every table under `directory`."""
        for ps in range(self.num_ps):
            request = pb.ExportTablesRequest(directory=directory)
            self._call(ps, lambda stub, r=request: stub.ExportTables(r, timeout=3600))

    # ------------------------------------------------------------------ steps

    def exchange(
        self,
        push: PushPayload | None,
        pull_ids: dict[str, np.ndarray],
        current_variables=None,
        pull_all: bool = False,
    ):
        """Push (optionally) and pull. Returns (dense or None, rows)."""
        return self.start_exchange(push, pull_ids, current_variables, pull_all).result()

    def start_exchange(
        self,
        push: PushPayload | None,
        pull_ids: dict[str, np.ndarray],
        current_variables=None,
        pull_all: bool = False,
    ) -> PendingExchange:
        """Send an exchange and return at once; `.result()` waits for its replies."""
        outbound: list[list[np.ndarray]] = [[] for _ in range(self.num_ps)]
        requests = [
            pb.PushPullRequest(
                known_version=-1 if pull_all else self.versions[ps], batch_key=-1, pull_all=pull_all
            )
            for ps in range(self.num_ps)
        ]
        if push is not None:
            for ps, request in enumerate(requests):
                request.epoch, request.source = push.epoch, push.source
                request.batch_key = push.batch_start
                request.learning_rate = push.learning_rate
                if push.versions is not None:
                    request.gradient_version = push.versions[ps]
                if push.ledger:
                    request.ledger_range.CopyFrom(
                        pb.RecordRange(
                            source=push.source, start=push.batch_start, end=push.batch_end
                        )
                    )
            for name, grad in push.dense.items():
                ps = self.dense_placement[name]
                to_tensor(grad, requests[ps].dense_grads[name], outbound[ps])
            for name, (ids, rows) in push.tables.items():
                owner = ids % self.num_ps if self.num_ps > 1 else None
                for ps, request in enumerate(requests):
                    mask = slice(None) if owner is None else owner == ps
                    entry = request.table_grads[name]
                    to_tensor(ids[mask], entry.ids, outbound[ps])
                    to_tensor(rows[mask], entry.values, outbound[ps])
        for name, ids in pull_ids.items():
            for ps, part in enumerate(split_ids(ids, self.num_ps)):
                to_tensor(part, requests[ps].pull_ids[name])
        # A blocking call on a sender thread per shard costs about half of what a gRPC
        # future does here (measured: ~0.58 ms against ~1.0 ms per round trip).
        futures = [
            sender.submit(self._push_pull, ps, req, outbound[ps])
            for ps, (sender, req) in enumerate(zip(self._senders, requests))
        ]
        return PendingExchange(
            self, requests, futures, pull_ids, pull_all, current_variables, outbound
        )

    def _push_pull(self, ps: int, request: pb.PushPullRequest, outbound: list[np.ndarray]):
        """(reply, its out-of-band buffers) from shard `ps`; `outbound`: the request's."""
        started = time.monotonic()
        try:
            return self.bulk[ps].push_pull(request, outbound)
        finally:
            self._exchanged[ps] = (started, time.monotonic())

    def _finish_exchange(self, pending: PendingExchange):
        requests, pull_ids, pull_all = pending.requests, pending.pull_ids, pending.pull_all
        replies = self._collect(
            requests, pending.futures, pending.current_variables, pending.outbound
        )
        for ps, (reply, _) in enumerate(replies):
            if self.incarnations[ps] not in (0, reply.incarnation) and not reply.dense:
                # The shard restarted from a checkpoint: its version numbers mean other
                # parameters now, so take its dense variables whatever the version says.
                # (Pull ids are never out of band: this request has no buffers.)
                again = pb.PushPullRequest(
                    known_version=-1, batch_key=-1, pull_ids=requests[ps].pull_ids
                )
                replies[ps] = self._call(ps, lambda _, p=ps, r=again: self._push_pull(p, r, []))
            self.incarnations[ps] = replies[ps][0].incarnation
        rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        changed = False
        pending.stale = [ps for ps, (reply, _) in enumerate(replies) if reply.stale]
        pending.learning_rates = [reply.learning_rate for reply, _ in replies]
        for ps, (reply, buffers) in enumerate(replies):
            self.versions[ps] = reply.version
            for name, tensor in reply.dense.items():
                self.dense_values[name] = to_array(tensor, buffers)
                changed = True

        def shard_rows(name: str) -> list[np.ndarray]:
            return [to_array(reply.rows[name], buffers) for reply, buffers in replies]

        for name, ids in pull_ids.items():
            rows[name] = (
                np.concatenate(split_ids(ids, self.num_ps)),
                np.concatenate(shard_rows(name)),
            )
        if pull_all:  # whole tables: shard `ps` sent ids ps, ps + num_ps, ...
            for definition in self.tables:
                shards, total = shard_rows(definition.name), definition.input_dim
                table = np.empty((total, definition.dim), shards[0].dtype)
                for ps, shard in enumerate(shards):
                    assert shard.shape[0] == rows_on_shard(total, ps, self.num_ps)
                    table[ps :: self.num_ps] = shard
                rows[definition.name] = (np.arange(total, dtype=np.int64), table)
        return (dict(self.dense_values) if changed else None), rows

    # ------------------------------------------------------------------ calls

    def _collect(
        self, requests: list[pb.PushPullRequest], futures, current_variables, outbound
    ) -> list[tuple[pb.PushPullResponse, list[np.ndarray]]]:
        """Per shard: (reply, its out-of-band buffers)."""
        replies = []
        for ps, future in enumerate(futures):

            def again(_, p=ps):
                return self._push_pull(p, requests[p], outbound[p])

            try:
                reply = future.result()
            except grpc.RpcError as err:
                if err.code() not in _RETRYABLE and err.code() not in MISDIRECTED:
                    raise
                # (which asks where the shard is now; the spell began with this exchange)
                reply = self._call(ps, again, since=self._exchanged[ps][0], first_error=err)
            else:
                started, ended = self._exchanged[ps]
                if ended - started > SLOW_EXCHANGE_SECONDS:
                    self._outage(ps, ended - started, True, "no answer (the exchange was late)")
            if not reply[0].initialized:  # a shard restarted before its first checkpoint
                log.warning("PS %d is empty: initializing it from this worker's model", ps)
                self._call(
                    ps,
                    lambda stub, p=ps: stub.Init(
                        self._init_request(
                            p, current_variables() if current_variables else self._variables
                        ),
                        timeout=60,
                    ),
                )
                reply = self._call(ps, again)
            replies.append(reply)
        return replies

    def _call(self, ps: int, call, since: float | None = None, first_error=None):
        """Call shard `ps`, retrying with backoff while it is unreachable or its address
        answers as something else, asking the master where it is before each retry.
        `since`, `first_error`: when the spell began, and how, if an earlier call failed."""
        backoff = self._backoff()
        confirmed_wrong = 0
        since = time.monotonic() if since is None else since
        failed = first_error
        while True:
            try:
                reply = call(self.stubs[ps])
                if failed is not None:
                    self._outage(ps, time.monotonic() - since, True, _said(failed))
                return reply
            except grpc.RpcError as err:
                failed = err
                tried = self.addresses[ps]
                wrong = wrong_peer(err, f"PS {ps}", tried)
                if wrong is None and err.code() not in _RETRYABLE:
                    raise
                if self._relocate(ps) == tried and wrong is not None:
                    confirmed_wrong += 1
                    if confirmed_wrong >= MISDIRECTED_CONFIRMATIONS:
                        raise wrong from err
                if backoff.exhausted:
                    self._outage(ps, time.monotonic() - since, False, _said(err))
                    raise PeerUnreachable(
                        f"PS {ps} (last at {tried}) did not answer for "
                        f"{backoff.waited:.0f} s: {err.code().name}: {err.details()}"
                    ) from err
                log.info(
                    "PS %d at %s: %s; retrying in %.2f s", ps, tried, err.code().name, backoff.delay
                )
                backoff.wait()

    def _outage(self, ps: int, seconds: float, healed: bool, detail: str) -> None:
        log.warning(
            "PS %d did not answer for %.1f s (%s): %s",
            ps,
            seconds,
            "answered again" if healed else "giving up",
            detail,
        )
        if self._on_outage is not None:
            self._on_outage(f"ps-{ps}", seconds, healed, detail)


def _said(err: grpc.RpcError) -> str:
    return f"{err.code().name}: {err.details()}"
