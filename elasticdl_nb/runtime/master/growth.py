"""Growing a worker range only while it pays (`scale_policy="throughput"`).

With the default policy a job with `workers="2:6"` asks for its MAX at once and takes
what the scheduler gives. With "throughput" the master asks for MIN, measures the job's
samples/s, then asks for one more worker at a time and measures again: while the newest
adds at least MIN_GAIN over the throughput without it, it asks for the next; when one
adds less, it gives that one back and holds ("holding at 3: the 4th added 2%"). A
worker that adds nothing is CPU another job could train with (bench/scaling.py: a CTR
job on one PS runs 1.44x at 2 workers and 1.48x at 4).

A measurement: once exactly the asked number of workers run (each has asked for work)
and have for `settle_s` (the newest one's first tasks pay for its start), the training
samples applied over the next `window_s`. A worker lost or gained meanwhile, or a
phase other than training (an evaluation round, the epoch's reconcile), starts the
window over. A `scale` to a new range starts the policy over from the workers that run;
a fixed count turns it off. Every decision is journaled (`growth` events), so a master
that takes the job over asks for what the last one asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from elasticdl_nb.vocabulary import EventKind

MIN_GAIN = 0.05  # (the spec's help says 5 %)
SETTLE_S, WINDOW_S = 5.0, 20.0


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class ThroughputGrowth:
    """Guarded by the master's lock (its coordinator calls `tick` each turn). The
    instance manager asks for no more workers than `asked` (None: no cap) and is told to
    look again through `converge()`; `bounds()` is the range (MIN, MAX) as the last
    `scale` left it (MIN 0: a fixed count, no policy)."""

    STATE = ("rates", "asked", "holding", "reason")  # (a master's snapshot: snapshot.py)

    def __init__(
        self,
        journal_append: Callable[..., None],
        *,
        bounds: Callable[[], tuple[int, int]],
        running: Callable[[], int],
        samples: Callable[[], int],
        converge: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        settle_s: float = SETTLE_S,
        window_s: float = WINDOW_S,
        min_gain: float = MIN_GAIN,
    ):
        self._append, self._bounds, self._running = journal_append, bounds, running
        self._samples, self._converge, self._clock = samples, converge, clock
        self.settle_s, self.window_s, self.min_gain = settle_s, window_s, min_gain
        self.asked: int | None = None  # None: off (a fixed count)
        self.holding = False
        self.reason = ""
        self.rates: dict[int, float] = {}  # samples/s measured at each worker count
        self._stable_since: float | None = None
        self._window: tuple[float, int] | None = None  # (start, samples then)

    # ------------------------------------------------------------------ decisions

    def start(self) -> None:
        """Ask for the range's MIN: before the instance manager starts, which launches
        what is asked for then."""
        low, _ = self._bounds()
        self._restart(low, f"starting at MIN: {low}", converge=False)

    def rescaled(self) -> None:
        """A `scale` set a new range (or a fixed count): start over from what runs."""
        low, high = self._bounds()
        if not low:
            self.asked, self.holding, self.rates, self.reason = None, False, {}, ""
            self._converge()
            return
        at = min(max(self._running(), low), high)
        self._restart(at, f"a new range {low}:{high}: measuring again from {at}")

    def tick(self, training: bool) -> None:
        """One look: go on with the window, or decide when it is full."""
        if self.asked is None or self.holding:
            return
        now = self._clock()
        if not training or self._running() != self.asked:
            self._stable_since, self._window = None, None
            return
        if self._stable_since is None:
            self._stable_since = now
        if self._window is None:
            if now - self._stable_since >= self.settle_s:
                self._window = (now, self._samples())
            return
        started, samples_then = self._window
        if now - started < self.window_s:
            return
        self._decide((self._samples() - samples_then) / (now - started))

    def _decide(self, rate: float) -> None:
        n, (_, high) = self.asked, self._bounds()
        self.rates[n] = rate
        before = self.rates.get(n - 1)
        gain = None if not before else (rate - before) / before
        added = "" if gain is None else f"the {ordinal(n)} added {gain:.0%}"
        if gain is not None and gain < self.min_gain:  # (n - 1 was measured: n > MIN)
            self._decided(n, rate, gain, n - 1, True, f"holding at {n - 1}: {added}")
        elif n >= high:
            self._decided(n, rate, gain, n, True, f"holding at {n}, the range's MAX"
                          + (f": {added}" if added else ""))  # fmt: skip
        else:
            what = added or f"{n} train {rate:.0f} samples/s"
            self._decided(n, rate, gain, n + 1, False, f"{what}: asking for {n + 1}")

    def _decided(self, n, rate, gain, asked, holding, reason) -> None:
        measured = {"samples_per_s": round(rate, 3)}
        if gain is not None:
            measured["gain"] = round(gain, 4)
        self._append(
            EventKind.GROWTH, workers=n, asked=asked, holding=holding, reason=reason, **measured
        )
        self.asked, self.holding, self.reason = asked, holding, reason
        self._stable_since, self._window = None, None
        self._converge()

    def _restart(self, at: int, reason: str, converge: bool = True) -> None:
        self.rates, self.asked, self.holding, self.reason = {}, at, False, reason
        self._stable_since, self._window = None, None
        self._append(EventKind.GROWTH, workers=self._running(), asked=at, holding=False,
                     reason=reason)  # fmt: skip
        if converge:
            self._converge()

    # ------------------------------------------------------------------ takeover

    def replay(self, kind: str, data: dict) -> None:
        """What the last master decided (`recovery.py`); nothing is launched here: the
        instance manager's `resume` converges to what it asked for."""
        if kind != EventKind.GROWTH:
            return
        if "samples_per_s" in data:
            self.rates[data["workers"]] = data["samples_per_s"]
        else:  # (a start: what was measured before no longer holds)
            self.rates = {}
        self.asked, self.holding, self.reason = data["asked"], data["holding"], data["reason"]

    def status(self) -> dict:
        return {"asked": self.asked, "holding": self.holding, "reason": self.reason}
