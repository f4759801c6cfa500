"""Ring allreduce among the members of a group, over frames.py on TCP (inside mutual TLS
when the job has it: every member shows the job's one worker certificate, tls.py).

A group is an ordered list of members (worker id, address) with a version. Each member
listens (`RingListener`) for its predecessor, and connects to its successor (`Ring`).
`Ring.allreduce` sums a list of arrays across the group: reduce-scatter, then allgather,
n-1 steps each; in every step a member sends one chunk to its successor while it
receives one from its predecessor. Each chunk's final sum is computed by one member and
passed on, so every member ends with bit-identical results (replicas stay identical).

Failure is fast and whole. Any error (a peer's connection reset or closed, a frame that
is late past the deadline, a frame of another step) closes both of this member's ring
connections and raises `PeerLost`: its neighbours' next read or write fails at once, so
the abort travels around the ring in milliseconds rather than one deadline per member.
No partial result is ever returned; the caller agrees on the next group and retries.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from elasticdl_nb.runtime.protocol import frames
from elasticdl_nb.runtime.protocol.frames import (
    READY,
    accept_hello,
    greet,
    listen_socket,
    recv_frame,
    secure_accepted,
    send_frame,
)
from elasticdl_nb.runtime.protocol.tls import WORKER, JobTls

CONNECT_TIMEOUT = 10.0
NEWS_RANGE = 16  # see Ring.allreduce_with_news


class PeerLost(ConnectionError):
    """The collective broke: a member died, left or fell behind. `worker` is the
    neighbour whose connection failed (None if unknown)."""

    def __init__(self, worker: int | None, reason: str, timed_out: bool = False):
        super().__init__(f"ring peer {worker if worker is not None else '?'}: {reason}")
        # timed_out: `worker` did not send in time (it may hang), rather than it is gone.
        self.worker, self.reason, self.timed_out = worker, reason, timed_out


@dataclass(frozen=True)
class Group:
    version: int
    members: tuple[tuple[int, str], ...]  # (worker id, "host:port") in ring order

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, worker: int) -> int:
        for rank, (member, _) in enumerate(self.members):
            if member == worker:
                return rank
        raise ValueError(f"worker {worker} is not in group version {self.version}")

    def neighbours(self, worker: int) -> tuple[tuple[int, str], tuple[int, str]]:
        """(predecessor, successor) of `worker` in the ring."""
        rank = self.rank_of(worker)
        return self.members[rank - 1], self.members[(rank + 1) % self.size]


def member_name(worker: int) -> str:
    """How a member's listener is named in the handshake (protocol/frames.py)."""
    return f"worker-{worker}"


class RingListener:
    """Member `owner`'s listener: accepts connections from other members, authenticated
    by the job token and meant for `owner`, and keeps each until `take` asks for it by
    (group version, worker id, purpose): "ring" for a predecessor's ring link, "handoff"
    for arrays sent point to point (handoff.py)."""

    def __init__(self, host: str, token: str, owner: int, port: int = 0, tls: JobTls | None = None):
        self._token, self._name, self._tls = token, member_name(owner), tls
        self._listener = listen_socket(host, port)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._waiting: dict[tuple[int, int], socket.socket] = {}
        self._arrived = threading.Condition()
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True, name="ring-accept").start()

    def take(
        self, version: int, worker: int, timeout: float, purpose: str = "ring"
    ) -> socket.socket:
        """The connection `worker` opened for group `version`; PeerLost after `timeout`."""
        key = (version, worker, purpose)
        with self._arrived:
            if not self._arrived.wait_for(lambda: key in self._waiting or self._closed, timeout):
                raise PeerLost(worker, f"did not connect within {timeout:g} s", timed_out=True)
            if self._closed:
                raise PeerLost(worker, "this member's listener is closed")
            # Connections for older versions will never be taken: drop them.
            for old in [k for k in self._waiting if k[0] < version]:
                self._waiting.pop(old).close()
            return self._waiting.pop(key)

    def take_any(self, purpose: str, timeout: float) -> tuple[int, int, socket.socket]:
        """(version, worker, connection) of the first connection of `purpose` from
        anyone: a joiner does not know who will send it the model, or for which version."""
        with self._arrived:

            def arrived():
                return self._closed or any(k[2] == purpose for k in self._waiting)

            if not self._arrived.wait_for(arrived, timeout):
                raise PeerLost(None, f"no {purpose} connection within {timeout:g} s")
            if self._closed:
                raise PeerLost(None, "this member's listener is closed")
            key = min(k for k in self._waiting if k[2] == purpose)
            return key[0], key[1], self._waiting.pop(key)

    def close(self) -> None:
        with self._arrived:
            self._closed = True
            for sock in self._waiting.values():
                sock.close()
            self._waiting.clear()
            self._arrived.notify_all()
        self._listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _admit(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(CONNECT_TIMEOUT)
            conn = secure_accepted(conn, self._tls)
            if not accept_hello(conn, self._token, self._name):
                conn.close()
                return
            conn.sendall(READY)
            _, message, _ = recv_frame(conn, CONNECT_TIMEOUT, CONNECT_TIMEOUT)
            intro = json.loads(message)
            key = (int(intro["version"]), int(intro["worker"]), intro.get("purpose", "ring"))
        except (OSError, ValueError, KeyError):
            conn.close()
            return
        with self._arrived:
            if self._closed:
                conn.close()
                return
            stale = self._waiting.pop(key, None)
            if stale is not None:
                stale.close()
            self._waiting[key] = conn
            self._arrived.notify_all()


def connect(
    address: str,
    token: str,
    version: int,
    me: int,
    peer: int,
    timeout: float,
    purpose: str = "ring",
    tls: JobTls | None = None,
) -> socket.socket:
    """A link to member `peer`'s listener at `address`, introduced as `me` in group
    `version`; retried while the peer is still starting to listen."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = frames.connect(host, int(port), timeout, tls, WORKER)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise PeerLost(peer, f"not listening within {timeout:g} s") from None
            time.sleep(0.05)
        except OSError as exc:
            raise PeerLost(peer, f"cannot connect: {exc}") from None
    try:
        greet(sock, token, member_name(peer))
        intro = {"version": version, "worker": me, "purpose": purpose}
        send_frame(sock, json.dumps(intro).encode())
        return sock
    except OSError as exc:
        sock.close()  # not left to the collector: a dead peer's links close now
        raise PeerLost(peer, f"cannot connect: {exc}") from None


class Ring:
    """This member's place in one group version: a connection to its successor and one
    from its predecessor. Make a new Ring for every new group version."""

    def __init__(
        self,
        group: Group,
        me: int,
        listener: RingListener,
        token: str,
        timeout: float,
        tls: JobTls | None = None,
    ):
        self.group, self.me = group, me
        (self.pred, _), (self.succ, succ_address) = group.neighbours(me)
        self._out: socket.socket | None = None
        self._in: socket.socket | None = None
        self._sends: queue.Queue = queue.Queue()
        self._send_error: list[BaseException] = []
        if group.size == 1:
            return
        self._out = connect(succ_address, token, group.version, me, self.succ, timeout, tls=tls)
        try:
            self._in = listener.take(group.version, self.pred, timeout)
        except PeerLost:
            self.close()
            raise
        threading.Thread(target=self._send_loop, daemon=True, name="ring-send").start()

    # ------------------------------------------------------------------ the collective

    def allreduce(self, arrays: list[np.ndarray], step: int, timeout: float) -> list[np.ndarray]:
        """The elementwise sum of `arrays` over the group (each member passes arrays of
        the same shapes and order). `timeout`: how long to wait for any one chunk."""
        return self.allreduce_with_news(arrays, step, timeout, news=0)[0]

    def allreduce_with_news(
        self, arrays: list[np.ndarray], step: int, timeout: float, news: int
    ) -> tuple[list[np.ndarray], int]:
        """`allreduce`, plus the largest `news` any member passed (0..NEWS_RANGE-1): how
        members agree, within the step itself, on something one of them learned (e.g. the
        master made a newer group version). Every member gets the same answer."""
        if not 0 <= news < NEWS_RANGE:
            raise ValueError(f"news must be in 0..{NEWS_RANGE - 1}, not {news}")
        one_hot = np.zeros(NEWS_RANGE, np.float32)
        one_hot[news] = 1.0  # summed, the highest non-zero slot is the largest news
        *reduced, counts = self._sum([*arrays, one_hot], step, timeout)
        return reduced, int(np.flatnonzero(counts)[-1])

    def _sum(self, arrays: list[np.ndarray], step: int, timeout: float) -> list[np.ndarray]:
        if self.group.size == 1:
            return [np.array(a, copy=True) for a in arrays]
        flat = np.concatenate([np.asarray(a, np.float32).ravel() for a in arrays])
        n, rank = self.group.size, self.group.rank_of(self.me)
        bounds = np.linspace(0, flat.size, n + 1).astype(int)
        chunk = [flat[bounds[i] : bounds[i + 1]] for i in range(n)]
        try:
            for i in range(n - 1):  # reduce-scatter: chunk (rank+1) % n ends up complete here
                sent, got = (rank - i) % n, (rank - i - 1) % n
                chunk[got] += self._exchange(chunk[sent], ("rs", step, i), timeout)
            for i in range(n - 1):  # allgather: pass the complete chunks around
                sent, got = (rank - i + 1) % n, (rank - i) % n
                chunk[got][:] = self._exchange(chunk[sent], ("ag", step, i), timeout)
            self._sends.join()  # the last chunk is on its way before we return
            if self._send_error:
                raise PeerLost(self.succ, f"send failed: {self._send_error[0]}")
        except PeerLost:
            self.close()
            raise
        out, start = [], 0
        for a in arrays:
            size = int(np.prod(np.shape(a), dtype=np.int64))
            out.append(flat[start : start + size].reshape(np.shape(a)).astype(np.asarray(a).dtype))
            start += size
        return out

    def _exchange(self, outgoing: np.ndarray, tag: tuple, timeout: float) -> np.ndarray:
        """Send `outgoing` to the successor while receiving the predecessor's chunk."""
        header = json.dumps({"version": self.group.version, "tag": list(tag)}).encode()
        self._sends.put((header, np.ascontiguousarray(outgoing)))
        try:
            _, message, buffers = recv_frame(self._in, timeout, timeout)
        except TimeoutError:
            raise PeerLost(
                self.pred, f"no data within {timeout:g} s ({tag[0]} {tag[2]})", timed_out=True
            ) from None
        except OSError as exc:
            if self._send_error:
                raise PeerLost(self.succ, f"send failed: {self._send_error[0]}") from None
            raise PeerLost(self.pred, f"receive failed: {exc}") from None
        if json.loads(message).get("tag") != list(tag):
            raise PeerLost(self.pred, f"out of step: got {message!r}, expected {tag}")
        if self._send_error:
            raise PeerLost(self.succ, f"send failed: {self._send_error[0]}")
        return buffers[0].view(np.float32)

    def _send_loop(self) -> None:
        while True:
            item = self._sends.get()
            if item is None:
                self._sends.task_done()
                return
            header, array = item
            try:
                if not self._send_error:
                    send_frame(self._out, header, [array])
            except OSError as exc:
                self._send_error.append(exc)
                self._shutdown()  # our receive then fails at once, and the abort travels
            finally:
                self._sends.task_done()

    # ------------------------------------------------------------------ teardown

    def _shutdown(self) -> None:
        for sock in (self._out, self._in):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """Drop both connections (the neighbours' next read or write fails at once)."""
        self._shutdown()
        self._sends.put(None)
        for sock in (self._out, self._in):
            if sock is not None:
                sock.close()
