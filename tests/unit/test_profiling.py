"""The optional process profile covers work done in other threads (a PS's gRPC handlers)."""

from __future__ import annotations

import pstats
import threading

from elasticdl_nb.runtime import profiling


def _busy_in_a_thread():
    total = 0
    for i in range(20_000):
        total += i * i
    return total


def _main():
    worker = threading.Thread(target=_busy_in_a_thread)
    worker.start()
    worker.join()


def test_profile_includes_functions_run_by_other_threads(tmp_path, monkeypatch):
    monkeypatch.setenv(profiling.PROFILE_ENV, str(tmp_path))
    profiling.run(_main, "ps")
    (dump,) = tmp_path.glob("ps-*.prof")
    functions = {name for (_, _, name) in pstats.Stats(str(dump)).stats}
    assert {"_main", "_busy_in_a_thread"} <= functions


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(profiling.PROFILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    profiling.run(_main, "ps")
    assert list(tmp_path.iterdir()) == []
