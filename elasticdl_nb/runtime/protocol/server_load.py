"""How busy a server is: the calls that came, how long they waited for a thread, and
those it turned away.

A server made with a `ServerLoad` (channels.make_server) holds at most `max_calls` calls
at once, running or waiting for one of its threads; gRPC turns away a call beyond that at
once, with RESOURCE_EXHAUSTED and `BUSY_DETAILS`, which callers treat as "busy: try
again shortly" (protocol/patience.py). Without the bound a server behind its callers
queues every call: the wait grows until calls miss their deadlines and are sent again,
adding to the queue they missed in. With it, an overloaded server answers what it can
and the others back off, and a caller's wait is bounded by `max_calls` / the rate calls
are served.

The counts, read with `sample`:
- `arrived`: counted by an interceptor, in gRPC's serving thread, as each call comes;
- `admitted`, `started`, `finished`: by the thread pool, when gRPC hands it a call, when
  a thread takes it (how long it waited), when it returns;
- turned away: gRPC's serving thread decides each call (hand it to the pool, or turn it
  away) before it takes the next, so at each arrival every earlier call is decided:
  `arrived - admitted` then is exactly the calls turned away before it.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc

BUSY_DETAILS = "Concurrent RPC limit exceeded!"  # (gRPC's words when it turns one away)


@dataclass(frozen=True)
class LoadSample:
    """A server's load since the previous sample (and, `in_flight`/`waiting`, now)."""

    seconds: float  # since the previous sample
    arrived: int
    turned_away: int
    served: int  # calls that returned
    longest_wait_s: float  # the longest a call started since waited for a thread
    in_flight: int  # calls held now, running or waiting
    waiting: int  # of them, waiting for a thread


class ServerLoad(grpc.ServerInterceptor):
    """A server's load: add it as an interceptor and run the server's calls in its
    `pool` (channels.make_server does both)."""

    def __init__(self, max_calls: int, threads: int):
        self.max_calls, self.threads = max_calls, threads
        self._lock = threading.Lock()
        self._arrived = self._admitted = self._started = self._finished = 0
        self._turned_away = 0  # before the newest arrival (module docstring)
        self._longest_wait = 0.0
        self._last: tuple[float, int, int, int] = (time.monotonic(), 0, 0, 0)
        self.pool = _CountingPool(self, threads)

    def intercept_service(self, continuation, handler_call_details):
        with self._lock:
            self._turned_away = self._arrived - self._admitted
            self._arrived += 1
        return continuation(handler_call_details)

    def sample(self) -> LoadSample:
        """The load since the previous sample."""
        now = time.monotonic()
        with self._lock:
            then, arrived, turned_away, finished = self._last
            self._last = (now, self._arrived, self._turned_away, self._finished)
            longest, self._longest_wait = self._longest_wait, 0.0
            return LoadSample(
                seconds=now - then,
                arrived=self._arrived - arrived,
                turned_away=self._turned_away - turned_away,
                served=self._finished - finished,
                longest_wait_s=longest,
                in_flight=self._admitted - self._finished,
                waiting=self._admitted - self._started,
            )

    def _admit(self) -> None:
        with self._lock:
            self._admitted += 1

    def _start(self, waited: float) -> None:
        with self._lock:
            self._started += 1
            self._longest_wait = max(self._longest_wait, waited)

    def _finish(self) -> None:
        with self._lock:
            self._finished += 1


class _CountingPool(futures.ThreadPoolExecutor):
    """The server's threads, counting the calls gRPC hands them and their waits."""

    def __init__(self, load: ServerLoad, threads: int):
        super().__init__(max_workers=threads)
        self._load = load

    def submit(self, fn, /, *args, **kwargs):
        load, admitted = self._load, time.monotonic()
        load._admit()

        def call():
            load._start(time.monotonic() - admitted)
            try:
                return fn(*args, **kwargs)
            finally:
                load._finish()

        return super().submit(call)
