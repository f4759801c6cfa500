"""`%elasticdl` line magics in a real IPython shell, against a real local job."""

from __future__ import annotations

import pytest

from tests.conftest import job_processes
from tests.integration.faults import wait_for, wait_for_step
from tests.integration.models import digits_job, loss


@pytest.fixture(scope="module")
def shell(ipython_shell):
    return ipython_shell


def test_help_prints_the_usage_and_a_bad_command_line_one_line_without_a_traceback(
    shell, job_home, capsys
):
    assert shell.run_line_magic("elasticdl", "-h") is None
    out = capsys.readouterr()
    assert "usage: %elasticdl" in out.out and "attach" in out.out and "scale" in out.out

    assert shell.run_line_magic("elasticdl", "scale somejob") is None
    err = capsys.readouterr().err
    assert err == "%elasticdl scale: the following arguments are required: --workers\n"

    assert shell.run_line_magic("elasticdl", "frobnicate") is None
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err

    assert shell.run_line_magic("elasticdl", "attach no-such-job") is None
    err = capsys.readouterr().err
    assert "%elasticdl attach: No job named 'no-such-job'" in err and "Traceback" not in err


@pytest.mark.slow
def test_list_attach_scale_logs_and_stop_a_running_job(shell, job_home, capsys, monkeypatch):
    from tests.integration.test_faults import _paced_loss

    job, _, _ = digits_job(workers=1, epochs=30, loss=_paced_loss)
    wait_for_step(job, 5)
    shell.user_ns["job_name"] = job.name

    shell.run_line_magic("elasticdl", "list")
    assert job.name in capsys.readouterr().out

    attached = shell.run_line_magic("elasticdl", "attach {job_name}")  # expanded by IPython
    assert attached.name == job.name and attached.status()["state"] == "running"

    shell.run_line_magic("elasticdl", f"scale {job.name} --workers 2")
    wait_for(lambda: job.status()["workers"] == 2, 120, "two workers")

    shell.run_line_magic("elasticdl", f"logs {job.name} --role worker --index 0 --tail 50")
    assert "worker" in capsys.readouterr().out

    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert shell.run_line_magic("elasticdl", f"stop {job.name}") is None
    assert "not stopped" in capsys.readouterr().out
    assert job.status()["state"] == "running"

    final = shell.run_line_magic("elasticdl", f"stop {job.name} -f")
    assert final["state"] == "stopped"
    wait_for(lambda: job_processes(job_home) == [], 30, "no process left")


def _loss_that_raises_in_the_job(labels, predictions):
    """The digits loss on the notebook's one-minibatch check; an error in the job's worker."""
    import os

    if os.environ.get("ELASTICDL_NB_JOB_DIR"):
        raise ValueError("the labels are upside down")
    return loss(labels, predictions)


@pytest.mark.slow
def test_a_failed_job_and_a_missing_log_are_one_message_each_not_a_traceback(
    shell, job_home, capsys
):
    job, _, _ = digits_job(workers=1, epochs=1, evaluate=False, loss=_loss_that_raises_in_the_job)
    capsys.readouterr()

    # As in a notebook cell: an exception out of the magic would be a traceback here.
    result = shell.run_cell(f"%elasticdl wait {job.name}")
    assert result.success and result.result is None
    out, err = capsys.readouterr()
    assert err.startswith(f"%elasticdl wait: Job '{job.name}' failed: worker 0 failed in user code")
    assert "ValueError: the labels are upside down" in err  # the reason: the worker's error
    assert "JobFailed" not in out + err and "sdk/job.py" not in out + err  # not the notebook's

    result = shell.run_cell(f"%elasticdl logs {job.name} --role worker --index 9")
    assert result.success and result.result is None
    out, err = capsys.readouterr()
    assert err.startswith(f"%elasticdl logs: No log for worker 9 of job '{job.name}'; there are")
    assert "master" in err and "worker-0" in err  # the logs there are
    assert "Traceback" not in out + err
    assert job_processes(job_home) == []
