"""Standby workers (`standby_workers=`), with real processes: a standby gets ready and is
given no work; a worker SIGKILLed at a random step has its place taken by the standby
(no new process for it), another standby starts, and every record is applied once."""

from __future__ import annotations

import os
import signal

import pytest

from elasticdl_nb.runtime.ps.ledger import ledger_problems
from elasticdl_nb.spec import JobSpec, SpecError
from elasticdl_nb.vocabulary import INSTANCE_ENDED
from tests.conftest import job_processes
from tests.integration.faults import fault_rng, pid_of, wait_for, wait_for_step
from tests.integration.models import accuracy, digits_job

pytestmark = pytest.mark.slow
EPOCHS = 6


def _standbys(status: dict) -> list[dict]:
    return [i for i in status["instances"] if i.get("standby") and i["pid"]]


def test_a_standby_takes_a_killed_worker_s_place_and_another_stands_by(job_home):
    rng = fault_rng("standby")
    job, (x, _), (xt, yt) = digits_job(workers=2, standby_workers=1, epochs=EPOCHS)
    status = wait_for_step(job, rng.randint(10, 80))
    [standby] = wait_for(lambda: _standbys(job.status()), 60, "a standby worker")
    status = job.status()
    assert status["workers"] == 2 and status["standby_workers"] == 1
    victim = next(
        i["id"] for i in status["instances"] if i["role"] == "worker" and not i.get("standby")
    )
    os.kill(pid_of(status, "worker", victim), signal.SIGKILL)
    print(f"killed worker {victim} at step {status['step']}; standby {standby['id']}")

    final = job.wait(timeout=300)
    events = list(job.events(follow=False))
    assert final["state"] == "succeeded"
    assert ledger_problems(job.dir, 1, [len(x)], EPOCHS) == []
    assert accuracy(job.model(), xt, yt) >= 0.90
    # The standby took the victim's place: no new process for it ...
    [relaunch] = [e for e in events if e.kind == "relaunch"]
    assert relaunch.data["promoted"] and relaunch.data["replaces"] == victim
    assert relaunch.data["id"] == standby["id"]
    started = [e for e in events if e.kind == "instance" and e.data["kind"] == "started"]
    assert [e.data["id"] for e in started if e.data["id"] == standby["id"]] == [standby["id"]]
    # ... it trained nothing before, and did after ...
    losses = [e for e in events if e.kind == "loss" and e.data["worker"] == standby["id"]]
    assert losses and min(e.time for e in losses) > relaunch.time
    # ... no standby ended on its own while it waited (a standby is wanted, not retired) ...
    ends = [
        e.data
        for e in events
        if e.kind == "instance"
        and e.data.get("standby")
        and e.data["kind"] in INSTANCE_ENDED
        and e.time < relaunch.time
    ]
    assert ends == []
    # ... and another stood by in its place (the lowest priority, as every standby).
    later = [e.data for e in started if e.time > relaunch.time and e.data["role"] == "worker"]
    assert len(later) == 1 and later[0].get("standby") and later[0].get("elastic")
    assert job_processes(job_home) == []


def test_standby_workers_are_for_the_ps_strategy():
    with pytest.raises(SpecError, match="standby_workers= keeps workers ready"):
        JobSpec(data="x.csv", strategy="allreduce", standby_workers=1).validate()
