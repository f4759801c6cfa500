"""Spells in which the master could not reach a PS, journaled once the PS answers again:
the `peer_unreachable` event (by "master") that workers' reports give for their own calls
(`worker/ps_client.py`), so the journal says who could not reach whom, and for how long.

A spell runs from the start of the first call that failed to the answer of the next one
that went through; a PS that never answers again is relaunched or fails the job, which
the journal says in its own events.
"""

from __future__ import annotations

import threading
import time

import grpc

from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.vocabulary import EventKind


class PeerOutages:
    def __init__(self, journal: Journal, by: str = "master"):
        self._journal, self._by = journal, by
        self._lock = threading.Lock()
        self._spells: dict[str, tuple[float, int, str]] = {}  # peer -> (since, times, said)

    def failed(self, peer: str, started: float, error: BaseException) -> None:
        """A call to `peer` begun at `started` (monotonic) failed with `error`."""
        if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
            said = f"{error.code().name}: {error.details()}"
        else:
            said = " ".join(str(error).split())[:300]
        with self._lock:
            since, times, _ = self._spells.get(peer, (started, 0, ""))
            self._spells[peer] = (since, times + 1, said)

    def answered(self, peer: str) -> None:
        """A call to `peer` went through: the spell it ends, if any, goes to the journal."""
        with self._lock:
            spell = self._spells.pop(peer, None)
        if spell is None:
            return
        since, times, said = spell
        self._journal.append(
            EventKind.PEER_UNREACHABLE,
            by=self._by,
            peer=peer,
            seconds=round(time.monotonic() - since, 3),
            times=times,
            healed=True,
            detail=said,
        )
