"""The pods of a job and a service over time, polled from the API server, and the two
latencies bench/elastic_service.py judges read from that timeline: a new service pod's
scale call to Running, a scale-down to the job's workers back. (No TensorFlow and no
thread pins here: the unit tests read these functions on made-up timelines.)"""

from __future__ import annotations

import threading
import time

POLL_S = 0.25


class Poller:
    """A daemon thread that calls `poll()` every `interval` seconds until `stop()`."""

    interval = POLL_S

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        raise NotImplementedError


class PodClock(Poller):
    """Every POLL_S: when each pod was first seen, Running, marked for deletion and gone,
    and how many of the job's workers and the service's pods run (the timeline the
    latencies are read from)."""

    def __init__(self, core, namespace: str, job: str, service: str):
        super().__init__("pod-clock")
        self.core, self.namespace, self.job, self.service = core, namespace, job, service
        self.first_seen: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.deleting_at: dict[str, float] = {}  # its deletionTimestamp first seen
        self.gone_at: dict[str, float] = {}  # the first poll without it
        self.counts: list[tuple[float, int, int]] = []  # (t, job workers, service pods)

    def poll(self) -> None:
        try:
            pods = self.core.list_namespaced_pod(self.namespace).items
        except Exception:  # (the API server busy: a gap)
            return
        now = time.time()
        workers = service = 0
        present = {p.metadata.name for p in pods}
        for name in self.first_seen.keys() - present:
            self.gone_at.setdefault(name, now)
        for p in pods:
            name, labels = p.metadata.name, p.metadata.labels or {}
            self.first_seen.setdefault(name, now)
            if p.metadata.deletion_timestamp:
                self.deleting_at.setdefault(name, now)
            running = p.status.phase == "Running" and not p.metadata.deletion_timestamp
            if running:
                self.running_at.setdefault(name, now)
            if running and labels.get("app") == self.service:
                service += 1
            elif running and labels.get("elasticdl-nb/role") == "worker":
                workers += labels.get("elasticdl-nb/job") == self.job
        self.counts.append((now, workers, service))


def _scalings(changes: list[tuple[float, int]], up: bool):
    """Each scale-up (or scale-down) call of `changes` ((time, replicas), the first from
    0 replicas) as (its time, its replicas, the next change's time or inf)."""
    for i, (t, replicas) in enumerate(changes):
        before = changes[i - 1][1] if i else 0
        if (replicas > before) if up else (i and replicas < before):
            yield t, replicas, changes[i + 1][0] if i + 1 < len(changes) else float("inf")


def service_pod_latencies(
    clock: PodClock, changes: list[tuple[float, int]], service: str
) -> list[float]:
    """Seconds from each scale-up call (`changes`: (time, replicas)) to the Running of
    the service pods it made (those first seen before the next change)."""
    out = []
    for t, _, end in _scalings(changes, up=True):
        new = [n for n, seen in clock.first_seen.items() if n.startswith(service + "-")
               and t <= seen < end]  # fmt: skip
        out += [clock.running_at.get(n, float("inf")) - t for n in new]
    return out


def workers_back(clock: PodClock, changes, room_for) -> list[float]:
    """Seconds from each scale-down call until the job runs the workers the freed room
    holds (`room_for(replicas)`); inf when it never did before the next change."""
    out = []
    for t, replicas, end in _scalings(changes, up=False):
        want = room_for(replicas)
        back = [c[0] for c in clock.counts if t <= c[0] < end and c[1] >= want]
        out.append(back[0] - t if back else float("inf"))
    return out


def service_pods_gone(clock: PodClock, changes, service: str) -> list[dict[str, float]]:
    """For each scale-down call: seconds until the service pods it removed were marked
    for deletion and until the last of them was gone from the API (its CPU free for the
    scheduler), inf when one was never seen gone. What a slow `workers_back` waited
    for: the service leaving, or the workers' own return after it."""
    out = []
    for t, _, end in _scalings(changes, up=False):
        removed = [n for n, at in clock.deleting_at.items()
                   if n.startswith(service + "-") and t <= at < end]  # fmt: skip
        marked = max((clock.deleting_at[n] for n in removed), default=float("inf"))
        gone = max((clock.gone_at.get(n, float("inf")) for n in removed), default=float("inf"))
        out.append({"marked_s": marked - t, "gone_s": gone - t})
    return out
