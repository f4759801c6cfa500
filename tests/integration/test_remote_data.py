"""Real jobs training from s3:// data on a real S3-compatible server on loopback (moto,
credentials enforced): the SDK resolves the objects, the workers fetch their tasks'
ranges with the credentials the job inherits, and bad input fails before launch."""

from __future__ import annotations

import io

import numpy as np
import pytest

import elasticdl_nb as edl
from elasticdl_nb.backends import job_records
from elasticdl_nb.data import DataError
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.conftest import job_processes
from tests.integration.models import DIGITS, custom_model, digits_split, model_zoo_module

pytestmark = pytest.mark.slow


def csv_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.StringIO()
    header = ",".join([f"p{i}" for i in range(x.shape[1])] + ["digit"])
    np.savetxt(buffer, np.column_stack([x, y]), delimiter=",", header=header, comments="", fmt="%g")
    return buffer.getvalue().encode()


def test_a_job_trains_from_csv_objects_in_s3_with_every_record_applied_once(
    job_home, s3_server, monkeypatch
):
    s3_server.use(monkeypatch)
    (x, y), (xt, yt) = digits_split()
    prefix = s3_server.new_prefix()
    parts = np.array_split(np.arange(len(x)), 2)
    for i, rows in enumerate(parts):
        s3_server.put(f"{prefix}/train-{i}.csv", csv_bytes(x[rows], y[rows]))
    s3_server.put(f"{prefix}/test.csv", csv_bytes(xt, yt))

    job = edl.train(
        custom_model,
        **DIGITS,
        data=f"{prefix}/train-*.csv",
        validation_data=f"{prefix}/test.csv",
        label_column="digit",
        workers=2,
        ps=1,
        epochs=6,
        minibatch_size=32,
        minibatches_per_task=4,
        record_ledger=True,
    )
    status = job.wait(timeout=300)

    assert status["state"] == "succeeded", status
    assert status["metrics"]["accuracy"] >= 0.90
    assert ledger_problems(job.dir, 1, [len(rows) for rows in parts], epochs=6) == []
    assert job_processes(job_home) == []


def test_an_elasticdl_model_zoo_module_trains_from_tfrecord_objects_in_s3(
    job_home, s3_server, monkeypatch, tmp_path
):
    s3_server.use(monkeypatch)
    zoo = model_zoo_module("digits_tfrecord")
    zoo.write_digits_tfrecords(tmp_path, train_files=2)
    prefix = s3_server.new_prefix()
    for path in sorted(tmp_path.glob("*.tfrecord")):
        s3_server.put(f"{prefix}/{path.name}", path.read_bytes())

    job = edl.train(
        "digits_tfrecord.custom_model",
        model_zoo="examples/model_zoo/digits_tfrecord.py",
        data=f"{prefix}/train-*.tfrecord",
        validation_data=f"{prefix}/test.tfrecord",
        workers=2,
        epochs=8,
        minibatch_size=32,
    )
    status = job.wait(timeout=300)

    assert status["state"] == "succeeded", status
    assert status["metrics"]["accuracy"] >= 0.90


@pytest.mark.parametrize("problem", ["wrong secret", "missing bucket"])
def test_unreadable_s3_data_fails_before_anything_is_launched(
    job_home, s3_server, monkeypatch, problem
):
    (x, y), _ = digits_split()
    url = s3_server.put(f"{s3_server.new_prefix()}/train.csv", csv_bytes(x[:64], y[:64]))
    if problem == "wrong secret":
        s3_server.use(monkeypatch, secret="not-the-secret")
        expected = "refused the credentials.*AWS_SECRET_ACCESS_KEY"
    else:
        s3_server.use(monkeypatch)
        url = "s3://no-such-bucket/train.csv"
        expected = "bucket 'no-such-bucket' does not exist"

    with pytest.raises(DataError, match=expected):
        edl.train(custom_model, **DIGITS, data=url, label_column="digit", workers=1)
    assert job_records.all_jobs() == []
    assert job_processes(job_home, every=True) == []
