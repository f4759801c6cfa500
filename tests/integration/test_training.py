"""Real jobs on the local backend: real processes, real gRPC, real TensorFlow training."""

from __future__ import annotations

import numpy as np
import pytest

import elasticdl_nb as edl
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.conftest import job_processes
from tests.integration.models import accuracy, digits_job, model_zoo_module

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("overlap", [False, True], ids=["exact", "overlapped"])
def test_digits_job_reaches_90_percent_with_every_record_applied_once(job_home, overlap):
    job, (x, _), (xt, yt) = digits_job(
        workers=2, ps=1, epochs=6, minibatches_per_task=8, overlap_communication=overlap
    )
    status = job.wait(timeout=300)

    assert status["state"] == "succeeded"
    assert status["metrics"]["accuracy"] >= 0.90
    model = job.model()
    # The exported model is the model the final evaluation judged.
    assert accuracy(model, xt, yt) == pytest.approx(status["metrics"]["accuracy"], abs=1e-6)
    assert ledger_problems(job.dir, 1, [len(x)], epochs=6) == []
    assert job_processes(job_home) == []
    events = list(job.events(follow=False))
    assert [e.seq for e in events] == list(range(len(events)))
    # Every training task says where its worker's time went; the parts fit in the whole,
    # and together the tasks cover every minibatch of every epoch.
    timings = [e.data for e in events if e.kind == "worker_time"]
    assert {t["worker"] for t in timings} == {0, 1}
    for t in timings:
        assert 0 < t["compute_s"] and 0 < t["wait_s"]
        assert t["compute_s"] + t["wait_s"] <= t["task_s"] + 1e-6
    assert sum(t["minibatches"] for t in timings) >= 6 * -(-len(x) // 32)  # batches of 32


def test_ctr_model_with_embeddings_on_two_ps_learns_the_ground_truth(job_home):
    from sklearn.metrics import roc_auc_score

    ctr = model_zoo_module("ctr")
    vocab = 1000
    x, y, _ = ctr.make_ctr_data(60_000, vocab=vocab, seed=1)
    xt, yt, true_logits = ctr.make_ctr_data(10_000, vocab=vocab, seed=2)
    job = edl.train(
        lambda: ctr.custom_model(vocab=vocab),
        loss=ctr.loss,
        optimizer=ctr.optimizer,
        eval_metrics_fn=ctr.eval_metrics_fn,
        data=(x, y),
        validation_data=(xt, yt),
        workers=2,
        ps=2,
        epochs=2,
        minibatch_size=256,
        record_ledger=True,
    )
    status = job.wait(timeout=400)

    best_auc = roc_auc_score(yt, true_logits)
    model_auc = roc_auc_score(yt, job.model().predict(xt, verbose=0, batch_size=2048)[:, 0])
    print(
        f"AUC: model {model_auc:.3f}, job's evaluation {status['metrics']['auc']:.3f}, "
        f"ground truth {best_auc:.3f}, chance 0.5"
    )
    assert model_auc >= 0.5 + 0.7 * (best_auc - 0.5)
    assert status["metrics"]["auc"] == pytest.approx(model_auc, abs=0.01)
    assert ledger_problems(job.dir, 2, [len(x)], epochs=2) == []


def test_elasticdl_model_zoo_file_trains_unchanged_on_tfrecords(job_home, tmp_path):
    zoo = model_zoo_module("digits_tfrecord")
    train_glob, test_file = zoo.write_digits_tfrecords(tmp_path, train_files=3)
    job = edl.train(
        "digits_tfrecord.custom_model",
        model_zoo="examples/model_zoo/digits_tfrecord.py",
        data=train_glob,
        validation_data=test_file,
        workers=2,
        epochs=8,
        minibatch_size=32,
    )
    status = job.wait(timeout=300)
    assert status["metrics"]["accuracy"] >= 0.90


def test_csv_regression_recovers_known_weights(job_home, tmp_path):
    rng = np.random.default_rng(3)
    w = np.array([2.0, -1.0, 0.5])
    x = rng.normal(size=(3000, 3))
    y = x @ w + 0.3
    path = tmp_path / "linear.csv"
    np.savetxt(
        path, np.column_stack([x, y]), delimiter=",", header="a,b,c,target", comments="", fmt="%.6f"
    )

    def linear_model():
        import keras

        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def mse(labels, predictions):
        import tensorflow as tf

        return tf.reduce_mean(tf.square(tf.reshape(labels, [-1]) - predictions[:, 0]))

    def sgd():
        import keras

        return keras.optimizers.SGD(0.1)

    job = edl.train(
        linear_model,
        loss=mse,
        optimizer=sgd,
        data=str(path),
        label_column="target",
        workers=2,
        epochs=3,
        minibatch_size=50,
    )
    job.wait(timeout=300)
    kernel, bias = job.model().get_weights()
    np.testing.assert_allclose(kernel[:, 0], w, atol=0.02)
    np.testing.assert_allclose(bias, [0.3], atol=0.02)
