"""The master's lease: one master acts for a job at a time, even when its node is cut off.

A master pod whose node stops answering is evicted, and the Job makes a new master pod on
another node; but the old one may still run there (the node was cut off, not dead; its
process was frozen and thaws), and an admin's `kubectl delete --force` frees its name
while it runs. Two masters must never act at once: both would append to the journal,
hand out the same tasks, create and delete the same pods. So every master of a job holds
a `coordination.k8s.io` Lease (named as its Job, owned by it), the way client-go's leader
election does:

- The holder renews it every `RENEW_EVERY` seconds. A holder that has not renewed it for
  `RENEW_DEADLINE` seconds (the API server out of its reach, its process frozen) stops
  acting: `check()`, which the journal calls before every event and the launcher before
  every pod it creates or deletes, ends the process with `FENCED_EXIT`, and so does the
  renewing thread at the deadline, whether or not anything is being done. The deadline
  counts from when the last successful renewal was sent, by the holder's own monotonic
  clock (which runs on while the process is stopped).
- A successor takes the lease when its holder let it go (a master leaving on SIGTERM
  while the Job stays releases it: the successor goes on at once), or when the lease has
  not changed for its `leaseDurationSeconds` (`LEASE_SECONDS`) by the successor's own
  clock, counted from when it first saw that version: never by comparing the holder's
  timestamps with its own clock (nodes' clocks differ).

Since LEASE_SECONDS > RENEW_DEADLINE, the old master has stopped, by its clock, at least
`LEASE_SECONDS - RENEW_DEADLINE` seconds before a successor may act, as long as the two
clocks run at nearly the same rate (they count seconds, not dates). The API server orders
the writes: an update carries the version it read, so of two masters only one can take
a lease. A fenced master exits non-zero; if its pod still stands, the kubelet restarts it
there, and it waits for the lease as any successor does (and ends when the job is over).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from elasticdl_nb.backends.kubernetes.api import ApiServerOutOfReach, KubernetesError, call

log = logging.getLogger("elasticdl_nb.master")

LEASE_SECONDS = 15
RENEW_DEADLINE = 10.0
RENEW_EVERY = 2.0
REQUEST_SECONDS = 4.0  # one call's timeout: several tries fit in a renewal deadline
# The exit of a master that lost its lease: non-zero (restarted in place where its pod
# stays, to wait as a successor), and apart from a crash's codes in its pod's status.
FENCED_EXIT = 75


class MasterLease:
    """The job's Lease, held by this master from `acquire()` on (the runtime's `Fence`)."""

    def __init__(
        self,
        coordination_api,
        namespace: str,
        name: str,
        owner: dict[str, Any],
        holder: str,
        exit_process: Callable[[int], None] = os._exit,
    ):
        """`name`: the Lease's (the master's Job's), owned by `owner` (its reference).
        `holder`: this master's pod name; a suffix of its own tells two masters of one
        pod (a container the kubelet restarted) apart. `exit_process`: how a fenced
        master ends (tests)."""
        self.api, self.namespace, self.name, self.owner = coordination_api, namespace, name, owner
        self.identity = f"{holder}_{uuid.uuid4().hex[:8]}"
        self._exit = exit_process
        self._lease: dict[str, Any] | None = None  # as last read or written
        self._seen_version = ""
        self._seen_at = 0.0  # monotonic: when `_seen_version` was first seen
        self._renewed_at: float | None = None  # monotonic: when the last renewal was sent
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None  # renews the lease once it is held

    # ------------------------------------------------------------------ the holder

    def acquire(self, job_over: Callable[[], bool] = lambda: False) -> bool:
        """Wait until this master holds the lease, then keep renewing it (a thread).
        Returns False instead when `job_over()` turns true meanwhile. The API server out
        of reach is waited out; a refusal (no permission for leases) raises."""
        announced = ""
        while not job_over():
            try:
                if self._take():
                    self._keeper = threading.Thread(
                        target=self._keep, name="master-lease", daemon=True
                    )
                    self._keeper.start()
                    log.info("this master holds the job's lease (%s)", self.identity)
                    return True
            except ApiServerOutOfReach as exc:
                log.warning("waiting for the API server to take the lease: %s", exc)
            holder = self._holder()
            if holder and holder != announced:
                left = self._duration() - (time.monotonic() - self._seen_at)
                log.info(
                    "master %s holds the job's lease; taking it over if it is not renewed "
                    "within %.0f s",
                    holder,
                    max(0.0, left),
                )
                announced = holder
            time.sleep(RENEW_EVERY / 2)
        return False

    def check(self) -> None:
        """Return if this master may act: it renewed the lease within RENEW_DEADLINE,
        or has not competed for it yet (before `acquire`, it has done nothing to
        fence). Else the process ends, now."""
        if self._renewed_at is None:
            return
        silent = time.monotonic() - self._renewed_at
        if silent > RENEW_DEADLINE:
            self._fenced(
                f"the job's lease was last renewed {silent:.1f} s ago (the deadline is "
                f"{RENEW_DEADLINE:.0f} s): a successor may take the job over"
            )

    def release(self) -> None:
        """Let the lease go (this master leaves while its job goes on), so that a
        successor need not wait for it to expire. Best effort: unreleased, it expires."""
        self._stop.set()
        self._renewed_at = float("-inf")  # check() fences from now on
        if self._keeper is not None:
            # A renewal under way would write the lease after the release (or make the
            # release's write a conflict) and hold the successor off for a whole term.
            self._keeper.join(2 * REQUEST_SECONDS + 1)
        try:
            for _ in range(3):  # a conflict: someone wrote it since; read it again
                lease = self._lease = self._read()
                if lease is None or self._holder() != self.identity:
                    return
                lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1, renewTime=_now())
                if self._replace(lease, "release") is not None:
                    return
            log.warning("could not release the job's lease (it expires): it kept changing")
        except KubernetesError as exc:
            log.warning("could not release the job's lease (it expires): %s", exc)

    def _keep(self) -> None:
        """Renew every RENEW_EVERY s; fenced once the deadline passes without one."""
        failing = False
        while not self._stop.wait(RENEW_EVERY):
            try:
                # A refused write means another wrote the lease since; read it and try
                # again: it may be ours still (a renewal that timed out here but was
                # written).
                if not (self._take() or self._take()):
                    self._fenced(f"master {self._holder()} holds the job's lease now")
                if failing:
                    log.info("the job's lease is renewed again")
                failing = False
            except KubernetesError as exc:
                if not failing:
                    log.warning("cannot renew the job's lease (retrying): %s", exc)
                failing = True
            if not self._stop.is_set():
                self.check()

    def _fenced(self, why: str) -> None:
        log.error("this master stops acting and exits: %s", why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit(FENCED_EXIT)

    # ------------------------------------------------------------------ the lease

    def _take(self) -> bool:
        """One try to take or renew the lease; whether this master holds it now."""
        sent = time.monotonic()
        if self._lease is None or self._holder() != self.identity:
            self._lease = self._read()
        if self._lease is None:
            return self._create(sent)
        spec = self._lease.setdefault("spec", {})
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity:
            if time.monotonic() - self._seen_at < self._duration():
                return False  # held, and renewed within its duration as we saw it
            log.warning(
                "master %s has not renewed the job's lease for %ss: taking the job over",
                holder,
                spec.get("leaseDurationSeconds"),
            )
        now = _now()
        if holder != self.identity:
            transitions = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(acquireTime=now, leaseTransitions=transitions)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=LEASE_SECONDS, renewTime=now)
        written = self._replace(self._lease, "renew")
        if written is None:  # another wrote it since we read: read it again next time
            self._lease = None
            return False
        self._renewed_at = sent
        return True

    def _read(self) -> dict[str, Any] | None:
        lease = call(
            f"read Lease {self.name}",
            self.api.read_namespaced_lease,
            self.name,
            self.namespace,
            allow=(404,),
            timeout=REQUEST_SECONDS,
        )
        if lease is not None:
            self._saw(lease)
        return lease

    def _create(self, sent: float) -> bool:
        now = _now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "ownerReferences": [self.owner]},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        made = call(
            f"create Lease {self.name}",
            self.api.create_namespaced_lease,
            self.namespace,
            body,
            allow=(409,),  # another master made it first: compete for it next time
            timeout=REQUEST_SECONDS,
        )
        if made is None:
            return False
        self._saw(made)
        self._lease, self._renewed_at = made, sent
        return True

    def _replace(self, lease: dict[str, Any], what: str) -> dict[str, Any] | None:
        """Write `lease` if nobody has since the version it carries; None if one has."""
        written = call(
            f"{what} Lease {self.name}",
            self.api.replace_namespaced_lease,
            self.name,
            self.namespace,
            lease,
            allow=(409,),
            timeout=REQUEST_SECONDS,
        )
        if written is not None:
            self._saw(written)
            self._lease = written
        return written

    def _saw(self, lease: dict[str, Any]) -> None:
        version = lease["metadata"].get("resourceVersion", "")
        if version != self._seen_version:
            self._seen_version, self._seen_at = version, time.monotonic()

    def _holder(self) -> str:
        return ((self._lease or {}).get("spec") or {}).get("holderIdentity") or ""

    def _duration(self) -> float:
        spec = (self._lease or {}).get("spec") or {}
        return float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)


def _now() -> str:
    """A MicroTime: what the API server stores in a Lease's times."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
