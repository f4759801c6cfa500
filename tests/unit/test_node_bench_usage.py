"""What the node benchmarks say the pods use, by role (bench/node_bench.py): the figure the
requests are set by, from kubelet samples it did not see."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from node_bench import ideal_pair, pod_role, usage_by_role  # noqa: E402


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


def test_the_ideal_pair_gives_the_second_job_its_workers_beside_the_first_then_its_max():
    # Experiment A: 900m jobs on 1500m, the second beside the first with its master, PS
    # and 1 of its 3 workers (500m), 356 s alone, 30 s apart: 326 s at a third of its
    # speed beside, the 247 s left at MAX.
    ideal = ideal_pair(356.0, 30.0, 1 / 3, 900, 500, 1500)
    elastic = 356 + 356 - 326 / 3
    assert abs(ideal["ratio"] - elastic / 712) < 1e-9
    asked = 900 * 356 + 500 * 326 + 900 * (elastic - 356)
    assert abs(ideal["requested"] - asked / (1500 * elastic)) < 1e-9


def test_a_second_job_that_fits_beside_the_first_ends_there_and_never_grows():
    ideal = ideal_pair(200.0, 30.0, 0.5, 900, 600, 1500, longer=0.25)  # 50 s of work
    assert abs(ideal["ratio"] - 200 / 250) < 1e-9  # done at 130 s, the first's end at 200
    assert abs(ideal["requested"] - (900 * 200 + 600 * 100) / (1500 * 200)) < 1e-9
