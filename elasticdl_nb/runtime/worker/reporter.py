"""Progress reports to the master, sent from a background thread every `interval` seconds
(and at once when a task ends), so training never waits for the master per minibatch.

Reports are numbered: the master's channel retries a report whose reply was lost, and the
master counts each number once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import numpy as np

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.tensors import to_tensor

log = logging.getLogger("elasticdl_nb.worker")

NO_TASK = -1  # the task id of a report about no task (an allreduce step's loss, ...)
# With nothing else to send for this long, an empty report says "still here": the master
# gives up on a worker that holds a task and says nothing for much longer
# (master/worker_silence.py). From the reporter's own thread, so a worker that waits for a
# PS or computes a long step still says it.
HEARTBEAT_SECONDS = 5.0


class Reporter:
    def __init__(self, master: rpc.MasterStub, worker_id: int, interval: float = 0.2):
        self.master, self.worker_id, self.interval = master, worker_id, interval
        self._lock = threading.Lock()
        # One send at a time, in order: a task's `task_done` must not overtake the report
        # of its earlier minibatches (the master would drop those as belonging to no task).
        self._send_lock = threading.Lock()
        self._pending: dict[int, pb.ProgressReport] = {}
        self._sent = 0  # the number of the last report sent
        self._sent_at = time.monotonic()
        self.stop_requested = threading.Event()
        self._closed = threading.Event()
        self._send_soon = threading.Event()  # wakes the background thread before `interval`
        self._thread = threading.Thread(target=self._loop, daemon=True, name="reporter")
        self._thread.start()

    def _report(self, task_id: int) -> pb.ProgressReport:
        report = self._pending.get(task_id)
        if report is None:
            report = pb.ProgressReport(worker_id=self.worker_id, task_id=task_id)
            self._pending[task_id] = report
        return report

    def batch_done(
        self,
        task_id: int,
        start: int,
        loss: float,
        ps_versions: list[int],
        learning_rate: float = 0.0,
    ) -> None:
        with self._lock:
            report = self._report(task_id)
            report.batch_starts.append(start)
            report.losses.add(loss=loss, learning_rate=learning_rate)
            report.ps_versions[:] = ps_versions

    def applied(self, task_id: int, starts: list[int]) -> None:
        """Allreduce: minibatches of a task (any member's) the whole group applied."""
        with self._lock:
            self._report(task_id).batch_starts.extend(starts)

    def step_loss(self, loss: float, learning_rate: float = 0.0) -> None:
        """Allreduce: the loss of one step of the group and the learning rate it was
        applied with (one member reports it)."""
        with self._lock:
            self._report(NO_TASK).losses.add(loss=loss, learning_rate=learning_rate)

    def settled(self, version: int, step: int, seconds: float, cause: str) -> None:
        """Allreduce: the group's first step in a new version, `seconds` after the change."""
        with self._lock:
            self._report(NO_TASK).settled.CopyFrom(
                pb.GroupSettled(
                    version=version,
                    step=step,
                    seconds=seconds,
                    cause=cause,
                    completed_at=time.time(),
                )  # fmt: skip
            )
        self._send_soon.set()

    def outage(self, peer: str, seconds: float, healed: bool, detail: str) -> None:
        """`peer` did not answer for `seconds`; one entry per peer and report (the
        longest spell, how many)."""
        with self._lock:
            report = self._report(NO_TASK)
            entry = next((o for o in report.outages if o.peer == peer), None)
            if entry is None:
                entry = report.outages.add(peer=peer)
            entry.seconds = max(entry.seconds, seconds)
            entry.times += 1
            entry.healed, entry.detail = healed, detail[:300]
        self._send_soon.set()

    def task_done(
        self,
        task_id: int,
        metric_states: Mapping[str, list[np.ndarray]] | None = None,
        timing: pb.TaskTiming | None = None,
        wait: bool = True,
        exported_tables: str = "",
    ) -> None:
        """Send everything about the task now: and wait for the master to have it, or
        (`wait=False`, mid-training) hand it to the background thread at once."""
        with self._lock:
            report = self._report(task_id)
            report.task_done = True
            report.exported_tables = exported_tables
            if timing is not None:
                report.timing.CopyFrom(timing)
            for name, values in (metric_states or {}).items():
                report.metric_states.add(name=name, variables=[to_tensor(v) for v in values])
        if wait:
            self.flush()
        else:
            self._send_soon.set()

    def error(self, message: str, user_code: bool) -> None:
        try:
            self.master.ReportProgress(
                pb.ProgressReport(
                    worker_id=self.worker_id, error=message, error_is_user_code=user_code
                ),
                timeout=10,
            )
        except Exception as exc:  # the master is gone too: the exit code still tells
            log.error("could not report the error to the master: %s", exc)

    def flush(self) -> None:
        with self._send_lock:
            with self._lock:
                reports, self._pending = list(self._pending.values()), {}
            self._send(reports)

    def _send(self, reports: list[pb.ProgressReport]) -> None:
        for report in reports:
            self._sent += 1
            report.seq = self._sent
            reply = self.master.ReportProgress(report, timeout=10)
            self._sent_at = time.monotonic()
            if reply.stop:
                self.stop_requested.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._send_soon.wait(self.interval)
            self._send_soon.clear()
            try:
                with self._lock:
                    if not self._pending and time.monotonic() - self._sent_at > HEARTBEAT_SECONDS:
                        self._report(NO_TASK)  # empty: a heartbeat
                self.flush()
            except Exception:  # noqa: BLE001 - the main loop sees the master gone on GetTask
                log.exception("reporter")

    def close(self) -> None:
        self._closed.set()
        self._send_soon.set()
        self._thread.join(timeout=5)
        self.flush()
