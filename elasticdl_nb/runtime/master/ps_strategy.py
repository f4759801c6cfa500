"""The master's part in a parameter-server job: where each PS serves, what it lost when
it came back from a checkpoint, and whether every minibatch is really applied.

The PS are the record of what was applied. A worker reports a minibatch once every PS
accepted its gradients, but a PS that dies and restores its newest checkpoint loses the
updates after it. So before an epoch counts as done the master asks every PS which
minibatches it holds (`GetApplied`) and queues again whatever one of them is missing;
the same happens for the open epoch whenever a relaunched PS reports ready. Since a PS
drops a minibatch it already applied, work done twice is applied once.

Each PS reports where it serves (`ps_ready`) and is numbered by its incarnation, so a
retried report is not taken for a relaunch. While a PS is down the master gives no
address for it (`ps_lost`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import grpc

from elasticdl_nb.runtime.master.peer_outages import PeerOutages
from elasticdl_nb.runtime.master.strategy import JobControl
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.vocabulary import INSTANCE_ENDED, EventKind, InstanceState, Role

log = logging.getLogger("elasticdl_nb.master")

TABLE_STATS_EVERY = 5.0  # seconds between polls of the PS's table statistics


class PsStrategy:
    """`TrainingStrategy` with parameter servers. Its state is guarded by the master's
    lock; `reconcile` and `final_checkpoint` call the PS outside it."""

    pushes_before_more_work = True
    idle_wait_seconds = 0.05
    stops_unwanted_on_report = True
    holds_below_floor = True
    gives_up_on_silent_workers = True

    STATE = ("addresses", "_incarnations", "_seen_version", "_up")  # (snapshot.py)

    def __init__(
        self,
        job: JobControl,
        num_ps: int,
        fixed_addresses: list[str],
        ps_channel: Callable[[int, str], grpc.Channel],
    ):
        """`ps_channel(ps_id, address)`: a channel to that PS, with the job's credentials."""
        self._job, self._ps_channel = job, ps_channel
        # Where each PS serves ("" while it is not up) and a stub for it. Fixed addresses
        # (a Service per PS) are known now; elsewhere each PS reports the port it bound.
        self.addresses = list(fixed_addresses) or [""] * num_ps
        self.stubs: list[rpc.ParameterServerStub | None] = [None] * num_ps
        self._incarnations = [0] * num_ps
        self._seen_version = [0] * num_ps  # the newest version any worker saw, per PS
        self._up = [False] * num_ps  # (ever: a later ready is a relaunched PS)
        self._needs_reconcile = False
        self._observed_at = 0.0
        self._table_stats: dict | None = None  # as last journaled
        self._outages = PeerOutages(job.journal)

    def _ask(self, ps_id: int, call):
        """`call()` to PS `ps_id`; a failure or an answer after failures is journaled."""
        started = time.monotonic()
        try:
            reply = call()
        except Exception as exc:
            self._outages.failed(f"ps-{ps_id}", started, exc)
            raise
        self._outages.answered(f"ps-{ps_id}")
        return reply

    # ------------------------------------------------------------------ the PS's RPCs

    def ps_ready(self, ps_id: int, restored_version: int, address: str, incarnation: int) -> None:
        """A PS serves at `address`, restored from `restored_version` (-1: none)."""
        job = self._job
        with job.lock, job.journal.transaction():
            if incarnation == self._incarnations[ps_id]:
                return  # a retried report: this PS is counted already
            self._incarnations[ps_id] = incarnation
            self.addresses[ps_id] = address
            self.stubs[ps_id] = rpc.ParameterServerStub(self._ps_channel(ps_id, address))
            if self._up[ps_id]:  # a relaunched PS: what did it lose?
                lost = max(0, self._seen_version[ps_id] - max(restored_version, 0))
                job.journal.append(
                    EventKind.PS_RESTORED,
                    ps=ps_id,
                    restored_version=restored_version,
                    newest_seen_version=self._seen_version[ps_id],
                    updates_rolled_back=lost,
                )
                self._seen_version[ps_id] = max(restored_version, 0)
                self._needs_reconcile = True
            self._up[ps_id] = True
            job.journal.append(
                EventKind.INSTANCE,
                role=Role.PS,
                id=ps_id,
                kind=InstanceState.RUNNING,
                restored_version=restored_version,
                address=address,
                incarnation=incarnation,
            )
            job.wake()

    def addresses_now(self) -> list[str]:
        with self._job.lock:
            return list(self.addresses)

    # ------------------------------------------------------------------ TrainingStrategy

    def ready_to_train(self) -> bool:
        return all(self._up)

    def task_for_unwanted(self, worker_id: int) -> pb.Task:
        return pb.Task(type=pb.FINISHED)

    def worker_reported(self, report: pb.ProgressReport) -> None:
        for ps_id, version in enumerate(report.ps_versions):
            if ps_id < len(self._seen_version):
                self._seen_version[ps_id] = max(self._seen_version[ps_id], version)

    def worker_lost(self, worker_id: int) -> bool:
        return True  # what it reported is on every PS; the rest goes back at once

    def ps_lost(self, ps_id: int) -> None:
        """Nobody is to call the PS at its old address until it is back."""
        with self._job.lock:
            self.addresses[ps_id] = ""
            self.stubs[ps_id] = None

    def tick(self) -> None:
        pass

    def reconcile_needed(self) -> bool:
        return self._needs_reconcile

    def reconcile(self, last_epoch: int) -> bool:
        """Compare what the master counts done with what every PS holds, and queue again
        whatever is missing: for an epoch whose tasks have all ended, every minibatch must
        be held; for the open epoch, every minibatch reported done (a PS restored from a
        checkpoint lost the newer ones). With `grads_to_wait`, once no training task is
        left, each PS first applies the gradients still waiting for their version."""
        with self._job.lock:
            flush = not self._job.queue.training_pending()
        applied = self._applied_everywhere(flush)
        if applied is None:
            return False
        job = self._job
        with job.lock, job.journal.transaction():
            self._needs_reconcile = False
            for epoch, source, missing in job.queue.hold_only(applied, last_epoch, "rolled back"):
                job.journal.append(
                    EventKind.REQUEUE,
                    reason="not applied on every PS",
                    epoch=epoch,
                    source=source,
                    batches=len(missing),
                )
            job.work_changed()
            return True

    def _applied_everywhere(self, flush: bool) -> dict[tuple[int, int], set[int]] | None:
        """Minibatches applied on every PS shard, or None if a shard did not answer."""
        common: dict[tuple[int, int], set[int]] | None = None
        for ps_id, stub in enumerate(list(self.stubs)):
            if stub is None:
                log.info("PS %d is not up: GetApplied later", ps_id)
                return None
            try:
                request = pb.AppliedRequest(flush=flush)
                reply = self._ask(ps_id, lambda s=stub, r=request: s.GetApplied(r, timeout=10))
            except Exception as exc:  # a PS that is down is relaunched; ask again later
                log.info("PS not answering GetApplied: %s", exc)
                return None
            shard = {(e.epoch, e.source): set(e.batch_keys) for e in reply.entries}
            if common is None:
                common = shard
            else:
                common = {k: v & shard.get(k, set()) for k, v in common.items()}
        return common or {}

    def final_checkpoint(self) -> list[int] | None:
        versions = []
        for stub in list(self.stubs):
            try:
                if stub is None:
                    raise ConnectionError("a PS is not up")
                versions.append(stub.Checkpoint(pb.Empty(), timeout=60).version)
            except Exception as exc:
                log.info("final checkpoint not taken yet: %s", exc)
                with self._job.lock:
                    self._needs_reconcile = True
                return None
        return versions

    def observe(self, final: bool = False) -> None:
        """Journal the tables' statistics (`tables` event) when they changed."""
        now = time.monotonic()
        if not final and now - self._observed_at < TABLE_STATS_EVERY:
            return
        self._observed_at = now
        per_ps = []
        for ps_id, stub in enumerate(list(self.stubs)):
            try:
                if stub is None:
                    return  # a PS is down: its numbers come with the next poll
                stats = self._ask(ps_id, lambda s=stub: s.GetTableStats(pb.Empty(), timeout=10))
                per_ps.append(json.loads(stats.json))
            except Exception as exc:
                log.info("PS table statistics not read now: %s", exc)
                return
        tables: dict[str, dict[str, int]] = {}
        for shard in per_ps:
            for name, stats in shard.items():
                total = tables.setdefault(name, dict.fromkeys(stats, 0))
                for key, value in stats.items():
                    total[key] += value
        if not tables or tables == self._table_stats:
            return
        self._table_stats = tables
        ps_rows = [sum(stats["rows"] for stats in shard.values()) for shard in per_ps]
        self._job.journal.append(EventKind.TABLES, tables=tables, ps_rows=ps_rows)

    def status_fields(self) -> dict:
        return {}

    def held_still(self) -> AbstractContextManager:
        return contextlib.nullcontext()  # (its state is guarded by the job's lock)

    def replay(self, kind: str, data: dict) -> None:
        if kind == EventKind.INSTANCE and data["role"] == Role.PS:
            ps_id = data["id"]
            if data["kind"] == InstanceState.RUNNING and "address" in data:
                self._incarnations[ps_id] = data["incarnation"]
                self.addresses[ps_id] = data["address"]
                self._up[ps_id] = True
            elif data["kind"] in INSTANCE_ENDED and not data.get("expected"):
                self.addresses[ps_id] = ""
        elif kind == EventKind.PS_RESTORED:
            self._seen_version[data["ps"]] = max(data["restored_version"], 0)

    def resumed(self) -> None:
        """Reach every PS that is up again; before the next epoch counts, what each one
        holds is compared with what the journal counted done (as after a PS restore)."""
        with self._job.lock:
            for ps_id, address in enumerate(self.addresses):
                if address and self._up[ps_id]:
                    self.stubs[ps_id] = rpc.ParameterServerStub(self._ps_channel(ps_id, address))
            self._needs_reconcile = True
