"""What a running job's master is doing, changed only through `Phases.move`.

The order, and the one way back:

    training -> evaluating -> predicting -> exporting -> finishing -> done (succeeded)
        ^                                                     |
        +-----------------------------------------------------+
          a PS lost work at the very end (the final checkpoint could not be taken, or
          what every PS holds is short of what was counted done): it is trained again

`evaluating` is the final evaluation (a job without validation data passes through it
at once), `predicting` has the trained model's outputs for the prediction data written (a
job without any goes from `evaluating` to `exporting`), `exporting` waits for one worker
to write the model, `finishing` takes the final checkpoint; `done`, journaled just before
`succeeded`, is where a job that succeeded ends, so that its final status does not read
`finishing`. The job's state
(running, succeeded, failed, stopped) is apart from the phase: a job may fail or be
stopped in any phase, and keeps the phase it had.

Every change is journaled as a `phase` event with `phase` and `previous`; a move the
table does not allow is a bug in the master, and raises with the history of moves.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticdl_nb.vocabulary import EventKind, Phase

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.TRAINING: frozenset({Phase.EVALUATING}),
    Phase.EVALUATING: frozenset({Phase.PREDICTING, Phase.EXPORTING}),
    Phase.PREDICTING: frozenset({Phase.EXPORTING}),
    Phase.EXPORTING: frozenset({Phase.FINISHING}),
    Phase.FINISHING: frozenset({Phase.TRAINING, Phase.DONE}),
    Phase.DONE: frozenset(),  # (the end)
}


class IllegalPhaseChange(RuntimeError):
    """The master tried a move its transitions table does not allow."""


class Phases:
    """The job's current phase and every move so far. Not thread-safe on its own: the
    master calls it under its lock."""

    STATE = ("current", "history")  # (what a master's snapshot holds: snapshot.py)

    def __init__(self, journal_append: Callable[..., object], start: Phase = Phase.TRAINING):
        self._append = journal_append
        self.current = start
        self.history: list[Phase] = [start]

    def move(self, to: Phase) -> None:
        """Change to `to`, journaled; raises `IllegalPhaseChange` if the table forbids it."""
        if to not in TRANSITIONS[self.current]:
            allowed = ", ".join(sorted(TRANSITIONS[self.current])) or "nothing"
            raise IllegalPhaseChange(
                f"the master may not move from {self.current} to {to} (from {self.current} "
                f"only to {allowed}); phases so far: {' -> '.join(self.history)}"
            )
        previous, self.current = self.current, to
        self.history.append(to)
        self._append(EventKind.PHASE, phase=to, previous=previous)

    def replay(self, data: dict) -> None:
        """A move an earlier master of this job journaled (`recovery.py`)."""
        self.current = Phase(data["phase"])
        self.history.append(self.current)
