"""What the node benchmarks say the pods use, by role (bench/node_bench.py): the figure the
requests are set by, from kubelet samples it did not see."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from node_bench import pod_role, usage_by_role  # noqa: E402


def test_a_pod_s_role_comes_from_the_end_of_its_name_even_when_the_job_says_ps():
    assert pod_role("a-elastic-ps-worker-0") == "worker"
    assert pod_role("a-elastic-ps-ps-0") == "ps"
    assert pod_role("a-elastic-ps-master-jxrzh") == "master"
    assert pod_role("cpu-service-5d8f7c-abcde") == "service"


def test_usage_by_role_averages_every_pod_at_every_measured_sample():
    samples = [
        {"t": 0, "requested": {}, "used_by_role": {"worker": [150, 170], "ps": [90]}},
        {"t": 1, "requested": {}},  # (no usage read at this sample)
        {"t": 2, "requested": {}, "used_by_role": {"worker": [160], "master": [40]}},
    ]
    assert usage_by_role({"samples": samples}) == {"master": 40, "ps": 90, "worker": 160}
    assert usage_by_role({"samples": samples[1:2]}) == {}
