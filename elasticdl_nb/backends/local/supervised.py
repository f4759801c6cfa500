"""`SupervisedProcesses`: a local master's instance launcher, which asks the job's
supervisor (`supervisor.py`) to start and kill workers and PS over the socket it was
given (`supervisor_protocol.py`), and hears from it what happened to them.

Threads: one reads the socket: replies wake the caller that waits for them, events go
to a queue that another thread hands to the sink, in order. The reader never calls the
sink itself, because the sink takes the master's lock, which a caller waiting for a
reply (a launch from within the policy) may hold.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import threading
from typing import Any

from elasticdl_nb.backends.local.supervisor_protocol import (
    EVENT_FIELDS,
    SUPERVISOR_FD_ENV,
    LineReader,
    encode,
)
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.runtime.master.site import EventSink, InstanceEvent
from elasticdl_nb.vocabulary import InstanceState

log = logging.getLogger("elasticdl_nb.master")

REPLY_TIMEOUT = 60.0  # a loaded machine may take seconds to fork; more means it is stuck


class SupervisorUnreachable(ElasticDLError, RuntimeError):
    """The supervisor did not answer (it is gone, and this master is about to be too)."""


class _Delivered(threading.Event):
    """Set by the events thread once it reaches it: every event before it is delivered."""


class _Pending:
    def __init__(self, adopting: bool = False, drain: bool = False) -> None:
        self.done = threading.Event()
        # drain: set once the events that came before the reply are delivered
        self.delivered = _Delivered() if drain else None
        self.reply: dict[str, Any] = {}
        # adopt: the instance states that came before the reply, and what holds back the
        # events after it until those are delivered
        self.adopted: list[InstanceEvent] | None = [] if adopting else None
        self.gate = threading.Event()


class SupervisedProcesses:
    """`runtime.master.site.InstanceLauncher` over the supervisor's socket; `env` (the
    worker and PS environment) goes with every launch."""

    def __init__(self, env: dict[str, str], on_event: EventSink, fd: int | None = None):
        if fd is None:
            if not os.environ.get(SUPERVISOR_FD_ENV):
                raise ElasticDLError(
                    f"{SUPERVISOR_FD_ENV} is not set: a local job's master runs under its "
                    "supervisor (python -m elasticdl_nb.backends.local.supervisor), which "
                    "starts the workers and PS."
                )
            fd = int(os.environ[SUPERVISOR_FD_ENV])
        self._sock = socket.socket(fileno=fd)
        self._sock.set_inheritable(False)
        self._env = dict(env)
        self._on_event = on_event
        self._send_lock = threading.Lock()
        self._requests = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._adopting: _Pending | None = None
        self._closed = ""  # why the socket is closed, once it is
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True, name="supervisor-reader").start()
        threading.Thread(target=self._deliver, daemon=True, name="instance-events").start()

    # ------------------------------------------------------------------ InstanceLauncher

    def launch(self, role: str, instance_id: int, elastic: bool = False) -> None:
        """Returns once the supervisor has started the process; its `started` event
        follows on the events thread. (`elastic` changes nothing here: there is no
        scheduler to preempt it first.)"""
        self._request("launch", role=str(role), id=instance_id, env=self._env)

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        try:
            self._request("kill", role=str(role), id=instance_id, force=force)
        except SupervisorUnreachable as exc:
            log.warning("kill %s %d: %s", role, instance_id, exc)

    def grow_memory(self, role: str) -> str | None:
        return None  # local processes have no memory limit to raise

    def shutdown(self, grace_seconds: float) -> None:
        """Every worker and PS ends (SIGTERM, SIGKILL after the grace period); returns
        once they have and the sink has heard so (the supervisor sends their end events
        before its reply; the events thread delivers them before this returns)."""
        pending = _Pending(drain=True)
        try:
            self._request(
                "shutdown",
                timeout=grace_seconds + REPLY_TIMEOUT,
                pending=pending,
                grace=grace_seconds,
            )
        except SupervisorUnreachable as exc:
            log.warning("shutdown: %s", exc)
            return
        if not pending.delivered.wait(REPLY_TIMEOUT):
            log.warning("shutdown: the instances' end events were not delivered in time")

    def adopt(self) -> set[tuple[str, int]]:
        """The instances the supervisor knows (started by an earlier master of this job);
        their states go to the sink from this thread before this returns, and the events
        that follow wait until they have."""
        pending = _Pending(adopting=True)
        self._adopting = pending  # the reader collects the states until the reply
        try:
            reply = self._request("adopt", pending=pending)
            for event in pending.adopted or []:
                self._on_event(event)
        finally:
            self._adopting = None
            pending.gate.set()
        return {(role, instance_id) for role, instance_id in reply["known"]}

    # ------------------------------------------------------------------ the socket

    def _request(
        self, op: str, timeout: float = REPLY_TIMEOUT, pending: _Pending | None = None, **fields
    ) -> dict[str, Any]:
        req = next(self._requests)
        pending = pending or _Pending()
        self._pending[req] = pending
        try:
            with self._send_lock:
                if self._closed:
                    raise SupervisorUnreachable(self._closed)
                self._sock.sendall(encode({"op": op, "req": req, **fields}))
            if not pending.done.wait(timeout):
                raise SupervisorUnreachable(
                    f"the supervisor did not answer {op} in {timeout:.0f} s"
                )
        except OSError as exc:
            raise SupervisorUnreachable(f"the supervisor's socket failed: {exc}") from None
        finally:
            self._pending.pop(req, None)
        if "closed" in pending.reply:
            raise SupervisorUnreachable(pending.reply["closed"])
        if "error" in pending.reply:
            raise ElasticDLError(f"the supervisor could not {op}: {pending.reply['error']}")
        return pending.reply

    def _read(self) -> None:
        reader = LineReader()
        try:
            while data := self._sock.recv(65536):
                for message in reader.feed(data):
                    self._take(message)
            why = "the supervisor closed the connection"
        except OSError as exc:
            why = f"the supervisor's socket failed: {exc}"
        with self._send_lock:
            self._closed = why
        for pending in list(self._pending.values()):
            pending.reply = {"closed": why}
            pending.done.set()

    def _take(self, message: dict[str, Any]) -> None:
        if message.get("op") == "event":
            fields = {k: message[k] for k in EVENT_FIELDS if k in message}
            event = InstanceEvent(**{**fields, "kind": InstanceState(fields["kind"])})
            adopting = self._adopting
            if adopting is not None and not adopting.done.is_set():
                adopting.adopted.append(event)
            else:
                self._events.put(event)
            return
        pending = self._pending.get(message.get("req"))
        if pending is None:
            return  # its caller gave up waiting
        if pending.adopted is not None:
            self._events.put(pending.gate)  # later events wait for the adopted states
        if pending.delivered is not None:
            self._events.put(pending.delivered)  # (after the events that came before)
        pending.reply = message
        pending.done.set()

    def _deliver(self) -> None:
        while True:
            item = self._events.get()
            if isinstance(item, _Delivered):
                item.set()
                continue
            if isinstance(item, threading.Event):  # an adoption's gate
                item.wait()
                continue
            try:
                self._on_event(item)
            except Exception:  # one bad event must not end the delivery of the others
                log.exception("instance event %s", item)
