"""The allreduce strategy with real processes: replicas that stay identical, a member
SIGKILLed at a random step while the others carry on in place, members that join and
leave mid-run, and every minibatch applied exactly once throughout."""

from __future__ import annotations

import os
import re
import signal

import pytest

from elasticdl_nb.runtime.worker.replica_records import read_checksums, replica_problems
from tests.conftest import job_processes
from tests.integration.dashboards import rendered_dashboard
from tests.integration.faults import fault_rng, pid_of, wait_for, wait_for_step
from tests.integration.models import accuracy, digits_job, paced_loss

pytestmark = pytest.mark.slow

BATCH = 32


def _groups(events) -> list[dict]:
    return [e.data for e in events if e.kind == "group"]


def _rejoined(groups: list[dict], failure: dict, worker: int) -> bool:
    """`worker`, a replacement, joined the group: in the failure's own recovery when it
    was up before the survivors agreed (one of its `joiners`), or in a later version."""
    return worker in failure["joiners"] or any(
        g["reason"] == "joined" and g["joined"] == [worker] for g in groups
    )


def _end_pids(job) -> dict[int, int]:
    return {r["worker"]: r["pid"] for r in read_checksums(job.dir) if r["event"] == "end"}


def test_three_replicas_train_digits_to_90_percent_identically(job_home):
    job, (x, _), (xt, yt) = digits_job(workers=3, epochs=6, strategy="allreduce")
    final = job.wait(timeout=300)

    assert final["state"] == "succeeded"
    assert final["metrics"]["accuracy"] >= 0.90
    assert accuracy(job.model(), xt, yt) == pytest.approx(final["metrics"]["accuracy"], abs=1e-6)
    assert final["group"] == {"version": 1, "members": [0, 1, 2]}
    assert {i["role"] for i in final["instances"]} == {"worker"}  # no parameter server
    ends = [r for r in read_checksums(job.dir) if r["event"] == "end"]
    assert len(ends) == 3 and len({(r["step"], r["checksum"]) for r in ends}) == 1
    assert replica_problems(job.dir, [len(x)], BATCH, 6) == []
    assert job_processes(job_home) == []


def test_sigkill_of_a_member_mid_collective_the_survivors_carry_on_in_place(job_home):
    rng = fault_rng("allreduce-kill")
    epochs = 30
    job, (x, _), (xt, yt) = digits_job(
        workers=3, epochs=epochs, strategy="allreduce", loss=paced_loss
    )
    kill_at = rng.randint(20, 200)  # minibatches; a step holds three
    victim = rng.randrange(3)
    status = wait_for_step(job, kill_at)
    pids = {w: pid_of(status, "worker", w) for w in range(3)}
    os.kill(pids[victim], signal.SIGKILL)
    print(f"killed worker {victim} (pid {pids[victim]}) at minibatch {status['step']}")

    final = job.wait(timeout=300)
    events = list(job.events(follow=False))
    assert final["state"] == "succeeded", final.get("error")
    assert final["metrics"]["accuracy"] >= 0.90
    assert accuracy(job.model(), xt, yt) >= 0.90

    groups = _groups(events)
    failure = next(g for g in groups if g["reason"] == "failure")
    survivors = sorted(set(range(3)) - {victim})
    relaunched = next(e.data["id"] for e in events if e.kind == "relaunch")
    # The survivors form the next version, with the replacement if it was up in time
    # (under the fork server it can be: CI saw [0, 2, 3] after worker 1's loss).
    assert failure["left"] == [victim] and set(failure["joiners"]) <= {relaunched}
    assert sorted(failure["members"]) == sorted(survivors + failure["joiners"])
    # The survivors never restarted: the processes that end the job are the ones from
    # before the kill.
    ends = _end_pids(job)
    assert {w: ends[w] for w in survivors} == {w: pids[w] for w in survivors}
    # The relaunched worker joined the group and got the model from a peer.
    assert _rejoined(groups, failure, relaunched)
    assert relaunched in ends
    settled = [e.data for e in events if e.kind == "group_settled"]
    assert any(s["cause"] == "failure" and s["version"] == failure["version"] for s in settled)
    # The dashboard tells the story: the group's versions and how fast it recovered.
    header, details = rendered_dashboard(job)
    last = "join" if settled[-1]["cause"] == "joined" else "recovery"
    assert f"group v{groups[-1]['version']} (3 members), last {last} stepping again in" in header
    formed = ", ".join(map(str, sorted(failure["members"])))
    assert f"workers {formed} (worker {victim} lost at step" in details
    assert "stepping again at step" in details and "after the failure" in details
    # Replicas identical at every recorded step, every minibatch exactly once.
    assert replica_problems(job.dir, [len(x)], BATCH, epochs) == []
    assert job_processes(job_home) == []


def test_a_member_that_hangs_is_found_by_the_step_deadline_ended_and_replaced(job_home):
    rng = fault_rng("allreduce-hang")
    epochs = 30
    # No evaluation: a step after which a member evaluates is allowed to be slow, and the
    # stop should land on an ordinary step, whose deadline follows the step time.
    job, (x, _), (xt, yt) = digits_job(
        workers=3, epochs=epochs, strategy="allreduce", loss=paced_loss, evaluate=False
    )
    at = rng.randint(30, 200)
    victim = rng.randrange(3)
    status = wait_for_step(job, at)
    os.kill(pid_of(status, "worker", victim), signal.SIGSTOP)
    print(f"stopped worker {victim} at minibatch {status['step']}")

    final = job.wait(timeout=300)
    events = list(job.events(follow=False))
    assert final["state"] == "succeeded", final.get("error")
    assert accuracy(job.model(), xt, yt) >= 0.90
    failure = next(g for g in _groups(events) if g["reason"] == "failure")
    assert failure["left"] == [victim]
    # Its successor waited for it past a deadline drawn from the step time (~50 ms here,
    # so the floor of 2 s), far from a fixed 30 s; the others saw the abort go round.
    deadlines = [float(m.group(1)) for c in failure["causes"].values()
                 if (m := re.search(r"no data within ([0-9.]+) s", c))]  # fmt: skip
    assert deadlines and max(deadlines) < 10, failure["causes"]
    # The master ended the stopped process, and a new worker took its place in the group.
    ended = [e.data for e in events if e.kind == "instance" and e.data["id"] == victim]
    assert ended[-1]["kind"] == "killed" and ended[-1]["signal"] == "SIGKILL"
    relaunched = next(e.data["id"] for e in events if e.kind == "relaunch")
    assert _rejoined(_groups(events), failure, relaunched)
    assert replica_problems(job.dir, [len(x)], BATCH, epochs) == []


def test_members_join_and_leave_mid_run_and_replicas_stay_identical(job_home):
    epochs = 30
    job, (x, _), _ = digits_job(
        workers=2, epochs=epochs, strategy="allreduce", lr_scaling="linear", loss=paced_loss
    )
    wait_for_step(job, 20)
    job.scale(3)
    wait_for(lambda: job.status()["group"]["members"] == [0, 1, 2], 120, "worker 2 joined")
    job.scale(2)
    wait_for(lambda: job.status()["group"]["members"] == [0, 1], 60, "worker 2 left")
    final = job.wait(timeout=300)
    events = list(job.events(follow=False))

    assert final["state"] == "succeeded", final.get("error")
    groups = _groups(events)
    assert [(g["reason"], g["joined"], g["left"]) for g in groups] == [
        ("formed", [0, 1], []),
        ("joined", [2], []),
        ("left", [], [2]),
    ]
    exits = {
        e.data["id"]: e.data
        for e in events
        if e.kind == "instance" and e.data["kind"] in ("succeeded", "failed", "killed")
    }
    assert exits[2]["kind"] == "succeeded" and exits[2]["expected"]
    assert not any(e.kind == "relaunch" for e in events)
    checksums = read_checksums(job.dir)
    assert {r["event"] for r in checksums if r["worker"] == 2} == {"entered", "end"}
    # lr_scaling="linear": Adam's 0.002 times members / workers, the same on every replica.
    rates = {(r["version"], r["worker"]): r["learning_rate"] for r in checksums}
    assert rates[(1, 0)] == rates[(1, 1)] == pytest.approx(0.002)
    assert rates[(2, 0)] == rates[(2, 1)] == rates[(2, 2)] == pytest.approx(0.003)
    assert rates[(3, 0)] == rates[(3, 1)] == pytest.approx(0.002)
    assert replica_problems(job.dir, [len(x)], BATCH, epochs) == []


def test_every_member_sigkilled_at_once_the_job_resumes_from_the_replicas_checkpoint(job_home):
    rng = fault_rng("allreduce-total-loss")
    epochs = 12
    job, (x, _), (xt, yt) = digits_job(
        workers=3, epochs=epochs, strategy="allreduce", loss=paced_loss, checkpoint_steps=10
    )
    kill_at = rng.randint(60, 250)  # minibatches (a step holds three): past a checkpoint
    status = wait_for_step(job, kill_at)
    pids = [pid_of(status, "worker", w) for w in range(3)]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    print(f"killed every worker ({pids}) at minibatch {status['step']}")

    final = job.wait(timeout=600)
    events = list(job.events(follow=False))
    assert final["state"] == "succeeded", final.get("error")
    restored = next(g for g in _groups(events) if g["reason"] == "restored")
    assert restored["left"] == [0, 1, 2] and restored["step"] > 0
    formed = [g for g in _groups(events) if g["reason"] == "formed"]
    assert formed[-1]["restore"] == restored["restore"]
    rolled_back = next(
        e.data
        for e in events
        if e.kind == "requeue" and e.data.get("reason") == "every replica lost"
    )
    print(f"back to step {restored['step']}; {rolled_back['batches']} minibatches trained again")
    assert final["metrics"]["accuracy"] >= 0.90
    assert accuracy(job.model(), xt, yt) >= 0.90
    # Every minibatch exactly once, counting what the lost replicas applied after the
    # checkpoint as undone; the replacements' replicas identical.
    assert replica_problems(job.dir, [len(x)], BATCH, epochs) == []
    assert job_processes(job_home) == []


def _decaying_adam():
    import keras

    schedule = keras.optimizers.schedules.ExponentialDecay(0.004, decay_steps=20, decay_rate=0.8)
    return keras.optimizers.Adam(schedule)


def test_a_learning_rate_schedule_is_applied_at_the_groups_step(job_home):
    import keras

    job, _, _ = digits_job(workers=2, epochs=3, strategy="allreduce", optimizer=_decaying_adam)
    final = job.wait(timeout=300)
    events = list(job.events(follow=False))

    assert final["state"] == "succeeded"
    assert final["metrics"]["accuracy"] >= 0.80
    # One loss point per step (n = 1, 2, ...), with the rate its update was applied with:
    # the schedule's at that step, on every replica alike.
    rates = [point for e in events if e.kind == "loss" for point in e.data["learning_rates"]]
    schedule = keras.optimizers.schedules.ExponentialDecay(0.004, 20, 0.8)
    assert [n for n, _ in rates] == list(range(1, len(rates) + 1))
    assert len(rates) >= 3 * 1400 // (2 * BATCH)
    for n, rate in rates:
        assert rate == pytest.approx(float(schedule(n - 1)), rel=1e-5), n
    ends = [r for r in read_checksums(job.dir) if r["event"] == "end"]
    assert len({r["checksum"] for r in ends}) == 1
