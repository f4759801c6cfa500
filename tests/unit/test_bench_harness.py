"""The benchmark result rows: ratio direction, targets, limits (bench/harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import harness  # noqa: E402


def test_rates_compare_ours_over_the_baseline_by_medians():
    r = harness.row("c", "samples/s", [10, 30, 20], [40, 50], target=0.8)
    assert r["ours"]["median"] == 20 and r["baseline"]["median"] == 45
    assert r["ratio"] == pytest.approx(20 / 45)
    assert r["met"] is False
    assert (r["ours"]["min"], r["ours"]["max"], r["ours"]["n"]) == (10, 30, 3)


def test_times_compare_the_baseline_over_ours_so_that_higher_is_still_better():
    r = harness.row("c", "seconds", [2.0], [4.0], higher_is_better=False, target=1.5)
    assert r["ratio"] == pytest.approx(2.0)
    assert r["met"] is True


def test_limits_judge_the_worst_run_not_the_median():
    assert (
        harness.row("c", "p99 ms", [1, 2, 300], higher_is_better=False, limit=250)["met"] is False
    )
    assert harness.row("c", "p99 ms", [1, 2, 3], higher_is_better=False, limit=250)["met"]
    assert harness.row("c", "jobs ok", [1, 1], limit=1)["met"]


def test_a_row_without_runs_has_no_ratio_and_no_verdict():
    r = harness.row("c", "samples/s", [], [10.0], target=1.0)
    assert r["ratio"] is None and r["met"] is None
    assert "—" in harness.describe(r)


def test_percentile_interpolates_between_ranks():
    assert harness.percentile([0, 10], 50) == 5
    assert harness.percentile(list(range(101)), 99) == 99
