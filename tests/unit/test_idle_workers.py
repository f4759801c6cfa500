"""More workers than an epoch has tasks: the master hands out an epoch's tasks once the
epoch before is done, so the extra workers wait. train() says so before anything is
launched, with the minibatches_per_task that gives every worker a task."""

from __future__ import annotations

import warnings

import pytest

import elasticdl_nb as edl
from elasticdl_nb.spec import JobSpec
from tests.integration.models import DIGITS, custom_model, digits_split


@pytest.fixture(scope="module")
def digits():
    return digits_split()[0]  # 1,400 records: 3 tasks of 8 minibatches of 64


def submit(digits, **options) -> str:
    return edl.train(custom_model, **DIGITS, data=digits, backend="kubernetes",
                     dry_run=True, check=False, name="digits", **options)  # fmt: skip


def test_a_range_above_the_epoch_s_tasks_is_warned_of_with_the_fix(digits, job_home):
    with pytest.warns(edl.IdleWorkersWarning) as caught:
        submit(digits, workers="2:4")
    # (only ours: a ResourceWarning of an earlier test's object, collected meanwhile, may
    # come first; seen on a full run)
    (message,) = [str(w.message) for w in caught if w.category is edl.IdleWorkersWarning]
    assert "an epoch of this data is 3 task(s)" in message
    assert "at most 3 worker(s) train at once" in message
    assert "minibatches_per_task=7 makes 4 tasks an epoch" in message  # 448-record tasks


def test_workers_that_each_have_a_task_are_not_warned_of(digits, job_home):
    with warnings.catch_warnings():
        warnings.simplefilter("error", edl.IdleWorkersWarning)
        submit(digits, workers=3)
        submit(digits, workers=6, minibatches_per_task=3)  # 8 tasks


def test_when_even_one_minibatch_tasks_are_too_few_it_says_use_fewer_workers(job_home):
    x, y = digits_split()[0]
    with pytest.warns(edl.IdleWorkersWarning, match="even tasks of one minibatch are 2"):
        submit((x[:100], y[:100]), workers=3)


def test_tasks_per_epoch_rounds_every_source_up_to_whole_tasks():
    spec = JobSpec(data="x", minibatch_size=10, minibatches_per_task=2)
    assert spec.tasks_per_epoch([40, 41, 1]) == 2 + 3 + 1
    assert spec.tasks_per_epoch([40], minibatches_per_task=1) == 4
