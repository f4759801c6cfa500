"""Compact text progress for terminals, scripts and headless notebook runs.

The progress line says the epoch, records, step and rate, then the goodput, the live and
desired workers, and the stragglers, if any, in one line:

    [job] epoch 2/8 | 700/1400 records (50%) | step 66 | 812 rec/s | goodput 0.93 |
    workers 3/4 | straggler: worker 2 (2.6× median)

On a terminal the progress line is rewritten in place; elsewhere (a log, nbconvert) a line
is printed at most every few seconds. Events that matter — instances ending or
relaunching, re-queued work, evaluations, the end of the job — always get their own line:
the line the job's `JobView` logs for them, as the dashboard's log shows it.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.sdk.view.text import format_progress, job_figures
from elasticdl_nb.vocabulary import Event, EventKind


class ProgressPrinter:
    """Prints one job's events as they come (`show(event)`): the progress line (progress,
    goodput, live/desired workers, stragglers), rewritten in place on a terminal and at
    most every `every_seconds` elsewhere, and a line of its own for each notable event."""

    def __init__(self, name: str, out: TextIO | None = None, every_seconds: float = 5.0):
        self.name = name
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.every = every_seconds
        self.view = JobView(name, log_lines=1, loss_capacity=2)
        self._last = float("-inf")
        self._open_line = False

    def show(self, event: Event) -> None:
        line = self.view.apply(event)
        if event.kind == EventKind.PROGRESS:
            self._progress_line(event)
        elif line is not None:
            if self._open_line:
                self.out.write("\n")
                self._open_line = False
            self.out.write(f"[{self.name}] {line.text}\n")
            self.out.flush()

    def _progress_line(self, event: Event) -> None:
        view = self.view
        figures = job_figures(view.goodput(), view.workers_summary(), view.stragglers)
        text = " | ".join([f"[{self.name}] {format_progress(event.data)}", *figures])
        now = time.monotonic()
        if self.tty:
            self.out.write("\r" + text.ljust(100))
            self._open_line = True
        elif now - self._last >= self.every:
            self.out.write(text + "\n")
            self._last = now
        self.out.flush()
