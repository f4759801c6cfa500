"""Model-zoo modules written in ElasticDL's style for Keras 2 (issue 38), each trained as a
real elastic job and as a plain single-process Keras 2 loop of the same code
(`elasticdl_style/plain_loop.py`, in a fresh process under tf_keras, at the same time),
on the same data: the job's final evaluation reaches the loop's within 0.01."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import elasticdl_nb as edl
from elasticdl_nb.data import stage_arrays
from tests.integration.elasticdl_style import census_wide_deep, deepfm, mnist_cnn

HERE = Path(__file__).resolve().parent / "elasticdl_style"
REPO = HERE.parents[2]


class PlainLoop:
    """The module's code as a plain Keras 2 loop, in a process of its own that runs while
    the job does (the two are compared once both are done)."""

    def __init__(self, module: str, train: str, test: str, epochs: int, minibatch: int):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.elasticdl_style.plain_loop",
             str(HERE / f"{module}.py"), train, test, str(epochs), str(minibatch)],
            env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def metrics(self) -> dict:
        out, err = self.process.communicate(timeout=600)
        assert self.process.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])


def job_metrics(module: str, train: str, test: str, epochs: int, minibatch: int, **options):
    job = edl.train(
        f"{module}.custom_model",
        model_zoo=str(HERE / f"{module}.py"),
        data=train,
        validation_data=test,
        epochs=epochs,
        minibatch_size=minibatch,
        **options,
    )
    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final
    started = next(e.data for e in job.events(follow=False) if e.kind == "job_state")
    assert started["keras"] == "2"  # (found out: Keras 3 cannot build these)
    return final["metrics"]


def assert_reaches(job: dict, loop: dict, metric: str) -> None:
    """The job reaches the loop's `metric` within 0.01 (what issue 38 asks; above it is
    no failure: the loop alone scatters by ~0.01 between runs, the CNN's 0.9397-0.9473);
    and is not far above it, which would mean the two judged different things."""
    assert loop[metric] - 0.01 <= job[metric] <= loop[metric] + 0.03, (metric, job, loop)


def test_deepfm_with_elasticdl_s_embedding_and_k_sum(job_home, tmp_path):
    (train, test), _, _ = deepfm.write_tfrecords(tmp_path)
    loop = PlainLoop("deepfm", train, test, epochs=3, minibatch=64)
    job, loop = job_metrics("deepfm", train, test, 3, 64, workers=2), loop.metrics()
    print(f"DeepFM: job {job}, plain Keras 2 loop {loop}")
    assert_reaches(job, loop, "probs/auc")
    assert_reaches(job, loop, "logits/accuracy")


def test_census_wide_and_deep_with_string_lookups_and_a_version_schedule(job_home, tmp_path):
    (train, test), _, _ = census_wide_deep.write_tfrecords(tmp_path)
    loop = PlainLoop("census_wide_deep", train, test, epochs=2, minibatch=64)
    job, loop = job_metrics("census_wide_deep", train, test, 2, 64, workers=2), loop.metrics()
    print(f"census: job {job}, plain Keras 2 loop {loop}")
    assert_reaches(job, loop, "probs/auc")
    assert_reaches(job, loop, "probs/accuracy")


def test_mnist_like_cnn(job_home, tmp_path):
    train = stage_arrays(*mnist_cnn.write_arrays(12_000, seed=1), str(tmp_path / "train"))
    test = stage_arrays(*mnist_cnn.write_arrays(4_000, seed=2), str(tmp_path / "test"))
    loop = PlainLoop("mnist_cnn", train, test, epochs=3, minibatch=64)
    job, loop = job_metrics("mnist_cnn", train, test, 3, 64, workers=2), loop.metrics()
    print(f"CNN: job {job}, plain Keras 2 loop {loop}")
    assert_reaches(job, loop, "accuracy")
