"""The figures bench/elastic_service.py judges, read by bench/pod_timeline.py from a pod
timeline it did not see (service pods' Running after a scale-up, the job's workers back
after a scale-down, and when the service pods a scale-down removed left)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pod_timeline as bench  # noqa: E402


def clock(first_seen, running_at, counts, deleting_at=None, gone_at=None):
    return SimpleNamespace(first_seen=first_seen, running_at=running_at, counts=counts,
                           deleting_at=deleting_at or {}, gone_at=gone_at or {})  # fmt: skip


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


def test_a_scale_down_says_when_the_service_pods_it_removed_were_marked_and_gone():
    changes = [(100.0, 5), (150.0, 3), (200.0, 4), (250.0, 1)]
    deleting = {"service-x-4": 150.5, "service-x-5": 151.0, "service-x-1": 250.2,
                "service-x-2": 250.3, "service-x-3": 250.4, "beside-worker-2": 150.2}  # fmt: skip
    gone = {"service-x-4": 152.0, "service-x-5": 163.0, "service-x-1": 251.0,
            "service-x-2": 251.5, "beside-worker-2": 150.9}  # fmt: skip
    figures = bench.service_pods_gone(clock({}, {}, [], deleting, gone), changes, "service")
    # The slowest of the pods each call removed; the scale-up between is not a scale-down.
    assert figures[0] == {"marked_s": 1.0, "gone_s": 13.0}
    assert figures[1]["marked_s"] == pytest.approx(0.4)
    assert math.isinf(figures[1]["gone_s"])  # service-x-3 was never seen gone
    assert len(figures) == 2
