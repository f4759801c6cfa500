"""Whether the master keeps up with its workers, and the journal told when it does not.

The master's server holds at most `MAX_CALLS` calls at once, running or waiting for one
of its `THREADS` (protocol/server_load.py); beyond that gRPC turns a call away at once,
and the caller tries again shortly (protocol/patience.py). So a master with more workers
than it can serve slows them down (each waits for its turn) instead of queueing without
end until their calls miss their deadlines and are sent again.

At each coordinator turn `Saturation.check` looks at the server's load since the last
turn. The master is *saturated* when a call was turned away, or waited `WAIT_S` or more
for a thread; it has *caught up* once `CALM_S` pass with neither. Both are journaled:
`master_saturated` with what the first look saw, `master_caught_up` with the spell's
figures (how long, calls served and turned away, the longest wait).

While it is saturated, and for `SILENCE_SECONDS` after, no worker is given up on for its
silence (worker_silence.py): a worker whose calls wait in the master's queue, or are
turned away, is not silent, and relaunching it would only add to the load.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from elasticdl_nb.runtime.master.worker_silence import WorkerSilence
from elasticdl_nb.runtime.protocol.server_load import LoadSample, ServerLoad
from elasticdl_nb.vocabulary import EventKind

THREADS = 64  # the server's (each worker may hold one while it long-polls for a task)
MAX_CALLS = 4 * THREADS  # held at once: a caller waits for at most 3 x THREADS calls
WAIT_S = 1.0
CALM_S = 5.0


class Saturation:
    """The master's load, judged at each coordinator turn (module docstring). Guarded by
    the master's lock."""

    def __init__(
        self,
        append: Callable[..., object],
        load: ServerLoad,
        silence: WorkerSilence,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._append, self._load, self._silence, self._clock = append, load, silence, clock
        self._since: float | None = None  # when the spell began (None: keeping up)
        self._calm_since = 0.0  # the first look of the quiet run that may end it
        self._spell = {"served": 0, "turned_away": 0, "longest_wait_s": 0.0}

    @property
    def saturated(self) -> bool:
        return self._since is not None

    def check(self) -> None:
        sample = self._load.sample()
        now = self._clock()
        busy = sample.turned_away > 0 or sample.longest_wait_s >= WAIT_S
        if self._since is None:
            if busy:
                self._begin(now, sample)
            return
        self._add(sample)
        self._silence.excuse()
        if busy:
            self._calm_since = now
        elif now - self._calm_since >= CALM_S:
            self._end(now)

    def _begin(self, now: float, sample: LoadSample) -> None:
        self._since = self._calm_since = now
        self._spell = {"served": 0, "turned_away": 0, "longest_wait_s": 0.0}
        self._add(sample)
        self._silence.excuse()
        self._append(
            EventKind.MASTER_SATURATED,
            calls=sample.in_flight,
            waiting=sample.waiting,
            max_calls=self._load.max_calls,
            threads=self._load.threads,
            turned_away=sample.turned_away,
            longest_wait_s=round(sample.longest_wait_s, 3),
            calls_per_s=round(sample.served / sample.seconds, 1) if sample.seconds else 0.0,
        )

    def _add(self, sample: LoadSample) -> None:
        spell = self._spell
        spell["served"] += sample.served
        spell["turned_away"] += sample.turned_away
        spell["longest_wait_s"] = max(spell["longest_wait_s"], sample.longest_wait_s)

    def _end(self, now: float) -> None:
        seconds = now - self._since
        spell = self._spell
        self._append(
            EventKind.MASTER_CAUGHT_UP,
            seconds=round(seconds, 1),
            served=spell["served"],
            turned_away=spell["turned_away"],
            longest_wait_s=round(spell["longest_wait_s"], 3),
            calls_per_s=round(spell["served"] / seconds, 1) if seconds else 0.0,
        )
        self._since = None
