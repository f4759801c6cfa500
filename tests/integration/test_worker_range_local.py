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


def test_the_throughput_policy_grows_one_worker_at_a_time_while_it_pays(job_home):
    """Steps paced to 50 ms make throughput follow the workers, so the 2nd worker pays
    (about 2x); whatever the machine makes of the 3rd, every decision must follow its
    own measurement, and the workers running follow what it asks for."""
    job, _, _ = digits_job(
        workers="1:3", scale_policy="throughput", epochs=400, loss=paced_loss, evaluate=False
    )
    assert job.status()["growth"]["asked"] == 1

    def decided() -> list[dict]:
        return [e.data for e in job.events(follow=False) if e.kind == "growth"]

    wait_for(lambda: decided()[-1]["holding"], 300, "the policy to hold")
    measured = [d for d in decided() if "samples_per_s" in d]
    print("\n".join(d["reason"] for d in measured))
    assert [d["workers"] for d in measured][:2] == [1, 2]
    assert measured[1]["gain"] >= 0.05 and measured[1]["asked"] == 3  # the 2nd paid
    for d in measured:
        if d.get("gain", 1.0) < 0.05:
            assert (d["asked"], d["holding"]) == (d["workers"] - 1, True)
        elif d["workers"] == 3:
            assert (d["asked"], d["holding"]) == (3, True)
        else:
            assert (d["asked"], d["holding"]) == (d["workers"] + 1, False)
    held = measured[-1]["asked"]
    wait_for(lambda: job.status()["workers"] == held, 60, f"{held} workers")
    assert job.status()["growth"] == {
        "asked": held, "holding": True, "reason": measured[-1]["reason"]
    }  # fmt: skip
    job.stop()
