"""A worker range on the local backend, which has no scheduler: it starts MAX processes,
trains once MIN ask for work, and takes a new range from the CLI while it runs."""

from __future__ import annotations

import json

import pytest

from elasticdl_nb import cli
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.faults import wait_for, wait_for_step
from tests.integration.models import digits_job, paced_loss

pytestmark = pytest.mark.slow


def test_a_local_range_job_trains_and_takes_a_new_range_from_the_cli(job_home, capsys):
    epochs = 10  # (outlasts the scale below)
    job, (x, _), _ = digits_job(workers="2:3", epochs=epochs, loss=paced_loss, evaluate=False)
    wait_for_step(job, 5, timeout=120)
    status = job.status()
    assert (status["min_workers"], status["desired_workers"], status["workers"]) == (2, 3, 3)
    assert status["pending_workers"] == [] and status["waiting_for_workers"] is False

    assert cli.main(["scale", job.name, "--workers", "1:2"]) == 0
    scaled = json.loads(capsys.readouterr().out)
    assert (scaled["workers_to"], scaled["min_workers"]) == (2, 1)
    wait_for(lambda: job.status()["workers"] == 2, 60, "2 workers")
    assert job.status()["min_workers"] == 1

    assert job.wait(progress=False)["state"] == "succeeded"
    scales = [e.data for e in job.events(follow=False) if e.kind == "scale"]
    assert [(s["workers_to"], s.get("min_workers")) for s in scales] == [(3, 2), (2, 1)]
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
