"""What the node benchmarks say the pods use, by role (bench/node_bench.py): the figure the
requests are set by, from kubelet samples it did not see."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from node_bench import pod_role, proportional_bound, usage_by_role  # noqa: E402


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


def test_the_proportional_bound_of_two_equal_jobs_is_share_over_ratio():
    # 0.6 of the node, 135 s alone, the second 30 s later (experiment A, quick): the
    # second does 105 s × 2/3 beside the first, the 65 s left at MAX.
    bound = proportional_bound(0.6, 135.0, 30.0)
    assert abs(bound["ratio"] - 200 / 270) < 1e-9
    assert abs(bound["requested"] - 0.6 / (200 / 270)) < 1e-9


def test_a_second_job_that_fits_beside_the_first_ends_there_and_never_grows():
    bound = proportional_bound(0.6, 200.0, 30.0, longer=0.5)  # 100 s of work, 113 s room
    assert abs(bound["ratio"] - 200 / 300) < 1e-9  # (150 s at 2/3 speed: done at 180 s)
    assert abs(bound["requested"] - 0.6 * 300 / 200) < 1e-9
