"""The figures bench/elastic_service.py judges, read by bench/pod_timeline.py from a pod
timeline it did not see (service pods' Running after a scale-up, the job's workers back
after a scale-down)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pod_timeline as bench  # noqa: E402


def clock(first_seen, running_at, counts):
    return SimpleNamespace(first_seen=first_seen, running_at=running_at, counts=counts)


def test_a_new_service_pod_counts_from_the_scale_call_to_its_running():
    changes = [(100.0, 2), (150.0, 5), (200.0, 3)]
    seen = {"service-x-1": 100.5, "service-x-2": 100.6, "service-x-3": 150.2, "beside-w": 0.0}
    running = {"service-x-1": 101.0, "service-x-2": 103.5, "service-x-3": 152.0}
    latencies = bench.service_pod_latencies(clock(seen, running, []), changes, "service")
    assert latencies == [1.0, 3.5, 2.0]

    # One that never ran is as slow as it gets, not left out.
    del running["service-x-3"]
    latencies = bench.service_pod_latencies(clock(seen, running, []), changes, "service")
    assert latencies[-1] == math.inf


def test_workers_are_back_when_the_job_runs_what_the_freed_room_holds():
    changes = [(100.0, 5), (150.0, 2), (200.0, 1)]
    counts = [(100.0, 8, 0), (105.0, 3, 5), (150.5, 3, 2), (153.0, 5, 2), (154.0, 6, 2)]

    def room_for(replicas):
        return {2: 6, 1: 7}[replicas]

    back = bench.workers_back(clock({}, {}, counts), changes, room_for)
    assert back == [4.0, math.inf]  # 6 by 154 s; 7 never came before the end
