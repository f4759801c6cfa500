"""The master survives its own death (local backend): SIGKILLed three times at random
steps, each time a new master rebuilds the job from its newest snapshot and the journal
after it (the journal compacted every 150 events here, 20,000 by default) and the workers
and PS go on in the same processes; the job succeeds with every record applied exactly
once, and the journal read back and a follower of `Job.events()` see every kept event
once, in order."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from elasticdl_nb.runtime.ps.ledger import ledger_problems
from elasticdl_nb.runtime.worker.replica_records import replica_problems
from elasticdl_nb.vocabulary import INSTANCE_ENDED
from tests.conftest import job_processes
from tests.integration.faults import fault_rng, follow_events, wait_for, wait_for_step
from tests.integration.models import accuracy, digits_job, paced_loss
from tests.tensorboard_files import read_scalars

pytestmark = pytest.mark.slow

KILLS = 3
BATCH = 32


def _master(job) -> dict:
    return json.loads((Path(job.dir) / "master.json").read_text())


def _instance_pids(status: dict) -> dict[tuple[str, int], int]:
    return {
        (i["role"], i["id"]): i["pid"]
        for i in status["instances"]
        if i["pid"] and i["state"] not in INSTANCE_ENDED
    }


def _kill_the_master_three_times(job, rng, last_step: int) -> list[float]:
    """SIGKILL the master at three random steps, each after the one before has been
    replaced; returns how long each took to be serving again."""
    steps = sorted(rng.sample(range(20, last_step), KILLS))
    took = []
    for step in steps:
        wait_for_step(job, step)
        old = _master(job)["pid"]
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda old=old: _master(job)["pid"] != old, 60, "a new master")
        wait_for(lambda: job.status().get("state") == "running", 60, "the new master to serve")
        took.append(time.monotonic() - killed)
        print(f"killed master pid {old} at step >= {step}: serving again {took[-1]:.2f} s later")
    return took


COMPACT_EVERY = 150


def _check_the_journal(job, follower: threading.Thread, seen: list[int]) -> list:
    follower.join(30)
    tail = [json.loads(line)["seq"] for line in (Path(job.dir) / "events.jsonl").open()]
    assert tail == list(range(tail[0], tail[0] + len(tail))), "a gap or a repeat since the cut"
    events = list(job.events(follow=False))
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)) and seqs[-len(tail) :] == tail
    assert seen == sorted(set(seen)), "the follower of Job.events() got an event twice"
    assert set(seqs) <= set(seen), "the follower of Job.events() missed a kept event"
    cuts = [e.data["before"] for e in events if e.kind == "journal_compacted"]
    assert len(cuts) >= 5, cuts
    # Nothing of a dropped kind before the newest cut; every epoch and evaluation whole.
    assert not [e for e in events if e.seq < cuts[-1] and e.kind in ("queue", "evaluation_task")]
    restarts = [e.data for e in events if e.kind == "master_restarted"]
    assert [r["incarnation"] for r in restarts] == [1, 2, 3]
    print("restarts:", [{k: r[k] for k in ("snapshot", "replayed", "rebuild_s", "down_s",
                                           "adopted")} for r in restarts])  # fmt: skip
    for r in restarts:  # after a cut: from its snapshot, replaying what follows it only
        if any(cut < r["continued"] for cut in cuts):
            assert r["snapshot"] > 0 and r["replayed"] < COMPACT_EVERY + 100, r
    # The TensorBoard log, written by four masters in turn, holds every loss point once.
    scalars = read_scalars(Path(job.dir) / "tensorboard")
    points = [p[0] for e in events if e.kind == "loss" for p in e.data["points"]]
    assert [n for n, _ in scalars["training/loss"]] == points
    assert [v for _, v in scalars["job/master_restarts"]] == [1, 2, 3]
    return events


@pytest.mark.parametrize("strategy", ["ps", "allreduce"])
def test_the_master_killed_three_times_the_job_goes_on_and_applies_every_record_once(
    job_home, strategy
):
    import keras

    rng = fault_rng(f"master-kill-{strategy}")
    epochs = 12
    # Callbacks called by four masters in turn: each call made once, their decisions kept.
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=100),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.002 * 0.9**epoch),
    ]
    job, (x, _), (xt, yt) = digits_job(
        workers=2,
        epochs=epochs,
        strategy=strategy,
        loss=paced_loss,
        checkpoint_steps=40,
        callbacks=callbacks,
        journal_compact_every=COMPACT_EVERY,
    )
    seen: list[int] = []
    follower = follow_events(job, seen)
    first = wait_for_step(job, 10)
    before = _instance_pids(first)
    _kill_the_master_three_times(job, rng, epochs * (1400 // BATCH) // 2)
    assert _instance_pids(job.status()) == before  # the same workers and PS, same pids

    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")
    events = _check_the_journal(job, follower, seen)
    ended_early = [
        e.data
        for e in events
        if e.kind == "instance" and e.data["kind"] in INSTANCE_ENDED and not e.data["expected"]
    ]
    assert ended_early == [], "a worker or PS ended with a master"
    assert not [e for e in events if e.kind == "relaunch"]
    calls = [(e.data["hook"], e.data["args"]) for e in events if e.kind == "callback"]
    ends = [args[0] for hook, args in calls if hook == "on_epoch_end"]
    assert ends == list(range(epochs))
    assert [args[0] for hook, args in calls if hook == "on_epoch_begin"] == list(range(epochs))
    assert [hook for hook, _ in calls].count("on_train_begin") == 1
    assert calls[-1][0] == "on_train_end"
    rates = [e.data for e in events if e.kind == "learning_rate"]
    assert [r["set"] for r in rates] == list(range(1, epochs + 1))
    assert [r["rate"] for r in rates] == pytest.approx([0.002 * 0.9**e for e in range(epochs)])
    assert final["metrics"]["accuracy"] >= 0.90
    assert accuracy(job.model(), xt, yt) >= 0.90
    if strategy == "ps":
        assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
    else:
        assert replica_problems(job.dir, [len(x)], BATCH, epochs) == []
    assert job_processes(job_home) == []
