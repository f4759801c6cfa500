"""The allreduce replicas' checkpoints: written off the step's path, whole or not at all,
the newest few kept, and the record of which minibatches each one holds kept exactly."""

from __future__ import annotations

import time

import numpy as np

from elasticdl_nb.runtime.collective import checkpoints
from elasticdl_nb.runtime.collective.checkpoints import Applied, CheckpointWriter


def test_the_record_of_applied_minibatches_survives_the_round_trip_as_runs():
    applied = Applied(32)
    minibatches = [(0, 0, s) for s in range(0, 32 * 50, 32)] + [(1, 0, 64), (1, 0, 128), (1, 1, 0)]
    applied.add(minibatches)
    assert applied.to_json()["0:0"] == [[0, 50]]  # one run for a whole stretch
    again = Applied.from_bytes(32, applied.to_bytes())
    assert again.held() == applied.held()
    assert again.held()[(1, 0)] == {64, 128}


def test_a_checkpoint_is_written_every_n_steps_and_read_back_whole(tmp_path):
    writer = CheckpointWriter(tmp_path, every=10, keep=2, member=0, max_busy_share=1.0)
    applied = Applied(8)
    state = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64)]
    for step in range(1, 41):
        applied.add([(0, 0, 8 * (step - 1))])
        copy = [a + step for a in state]
        writer.maybe_save(step, version=1, state=lambda copy=copy: copy, applied=applied)
        writer._writing and writer._writing.result()  # (each write done before the next step)
    writer.close()
    newest = checkpoints.newest(tmp_path, 8)
    assert newest.step == 40 and newest.version == 1
    assert [a.tolist() for a in newest.arrays()] == [(state[0] + 40).tolist(), 47]
    assert newest.applied.held() == {(0, 0): set(range(0, 8 * 40, 8))}
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "replicas-000000000030.json", "replicas-000000000040.json"
    ]  # fmt: skip
    assert len(writer.copy_seconds) == 4
    # each write appended only what was new: every minibatch is on the log once
    assert len((tmp_path / "replicas-applied-0.log").read_text().splitlines()) == 40


def test_a_checkpoint_without_its_record_is_not_whole_and_is_passed_over(tmp_path):
    writer = CheckpointWriter(tmp_path, every=1, keep=5, member=0)
    writer.maybe_save(1, 1, lambda: [np.zeros(2)], Applied(8))
    writer.close()
    (tmp_path / "replicas-000000000002.npz").write_bytes(b"half written")
    assert checkpoints.newest(tmp_path, 8).step == 1


def test_the_writer_keeps_to_its_share_of_the_time(tmp_path, monkeypatch):
    """Due every step, a writer whose write takes 20 ms starts one at most every 200 ms
    with a share of 0.1; with the whole time, one after the other."""
    savez = np.savez

    def slow_savez(*args):
        time.sleep(0.02)
        savez(*args)

    monkeypatch.setattr(checkpoints.np, "savez", slow_savez)
    started = {}
    for share in (0.1, 1.0):
        writer = CheckpointWriter(tmp_path / str(share), every=1, keep=2, member=0,
                                  max_busy_share=share)  # fmt: skip
        applied, deadline, step = Applied(8), time.monotonic() + 0.6, 0
        while time.monotonic() < deadline:
            step += 1
            applied.add([(0, 0, 8 * (step - 1))])
            writer.maybe_save(step, 1, lambda: [np.zeros(4)], applied)
            time.sleep(0.001)
        writer.close()
        started[share] = len(writer.copy_seconds)
    assert 1 <= started[0.1] <= 4, started  # 0.6 s / (20 ms written + 180 ms idle)
    assert started[1.0] >= 10, started  # 0.6 s / 20 ms, less the step's own time
