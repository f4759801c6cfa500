"""A job's predictions on disk (runtime/predictions.py) and the prediction data's
minibatches (worker/batches.py in Mode.PREDICTION): a file per task, rewritten whole when
the task is redone, read back in the data's order and the model's output structure; and
features without labels from arrays, CSV and a feed."""

from __future__ import annotations

import numpy as np
import pytest

from elasticdl_nb.data import SourceInfo, resolve_sources, stage_arrays
from elasticdl_nb.model.contract import ContractError, Mode, ModelContract
from elasticdl_nb.runtime.master.tasks import PREDICTION, TaskQueue
from elasticdl_nb.runtime.predictions import (
    IncompletePredictions,
    read_predictions,
    task_file,
    write_task,
)
from elasticdl_nb.spec import JobSpec


def test_task_files_read_back_in_the_data_s_order_whatever_order_they_were_written(tmp_path):
    rows = np.arange(50, dtype=np.float32).reshape(25, 2)
    # Two sources (15 and 10 records), tasks of 10, written last first.
    for source, start, end in [(1, 0, 10), (0, 10, 15), (0, 0, 10)]:
        offset = 15 * source
        part = rows[offset + start : offset + end]
        assert write_task(task_file(tmp_path, source, start), [part[:6], part[6:]]) == end - start
    np.testing.assert_array_equal(read_predictions(tmp_path, [15, 10]), rows)


def test_a_redone_task_replaces_its_file_so_each_record_has_one_prediction(tmp_path):
    write_task(task_file(tmp_path, 0, 0), [np.zeros((4, 1))])
    write_task(task_file(tmp_path, 0, 0), [np.ones((4, 1))])  # (the task again)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000-000000000000.npz"]
    np.testing.assert_array_equal(read_predictions(tmp_path, [4]), np.ones((4, 1)))


def test_dict_and_list_outputs_keep_their_structure(tmp_path):
    batch = {"logits": np.ones((3, 10)), "probs": np.full((3, 10), 0.1)}
    write_task(task_file(tmp_path / "d", 0, 0), [batch, batch])
    read = read_predictions(tmp_path / "d", [6])
    assert sorted(read) == ["logits", "probs"] and read["probs"].shape == (6, 10)
    write_task(task_file(tmp_path / "l", 0, 0), [[np.ones(2), np.zeros(2)]])
    first, second = read_predictions(tmp_path / "l", [2])
    assert first.tolist() == [1, 1] and second.tolist() == [0, 0]


def test_missing_or_short_files_are_said_not_read(tmp_path):
    with pytest.raises(IncompletePredictions, match="0 of 20 records"):
        read_predictions(tmp_path / "none", [20])
    write_task(task_file(tmp_path, 0, 0), [np.zeros((10, 1))])
    with pytest.raises(IncompletePredictions, match="10 of 20 records"):
        read_predictions(tmp_path, [20])
    write_task(task_file(tmp_path, 0, 15), [np.zeros((5, 1))])  # (a gap: 10-15)
    with pytest.raises(IncompletePredictions, match="starts at record 15"):
        read_predictions(tmp_path, [20])


def test_a_lost_worker_s_prediction_task_is_queued_again_whole():
    queue = TaskQueue(
        [SourceInfo("t", "npy", 10)], [], 10, 2, False, 0, prediction=[SourceInfo("p", "npy", 45)]
    )
    assert queue.add_prediction("/job/predictions") == 3
    task = queue.next_for(worker_id=4)
    assert (task.kind, task.start, task.end) == (PREDICTION, 0, 20)
    assert task.output_path == "/job/predictions/00000-000000000000.npz"
    assert queue.release_worker(4) == [(task, [])]
    again = queue.next_for(worker_id=5)
    assert (again.start, again.end, again.output_path) == (0, 20, task.output_path)
    assert queue.pending(PREDICTION)


def _batches(sources, feed=None, **options):
    from elasticdl_nb.runtime.worker.batches import BatchMaker

    contract = ModelContract(lambda: None, lambda a, b: None, lambda: None, feed=feed)
    spec = JobSpec.from_options(data=["x"], minibatch_size=4, **options)
    maker = BatchMaker(sources, contract, spec)
    return list(maker.batches(0, 0, sources[0].num_records, Mode.PREDICTION))


def test_prediction_minibatches_are_features_alone(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    staged = resolve_sources([stage_arrays(x, None, str(tmp_path / "x"))], "npy")
    batches = _batches(staged)
    assert [b.labels for b in batches] == [None, None]
    np.testing.assert_array_equal(np.concatenate([b.features for b in batches]), x)

    # CSV: every column is a feature, but the label column when the data has it.
    (tmp_path / "with.csv").write_text("a,b,y\n1,2,0\n3,4,1\n")
    (tmp_path / "without.csv").write_text("a,b\n1,2\n3,4\n")
    for name in ("with.csv", "without.csv"):
        (batch,) = _batches(resolve_sources([str(tmp_path / name)]), label_column="y")
        assert batch.features.tolist() == [[1, 2], [3, 4]] and batch.labels is None

    # A feed may give features alone in Mode.PREDICTION (ElasticDL's do).
    def feed(dataset, mode, metadata):
        assert mode == Mode.PREDICTION
        return dataset.map(lambda row: row * 2)

    (batch, _) = _batches(staged, feed=feed)
    assert batch.features.numpy().tolist() == [[0, 2], [4, 6], [8, 10], [12, 14]]


def test_a_processor_must_have_process():
    class NoProcess:
        pass

    contract = ModelContract(lambda: None, lambda a, b: None, lambda: None)
    assert contract.make_prediction_processor() is None
    contract.prediction_outputs_processor = NoProcess
    with pytest.raises(ContractError, match="has no process"):
        contract.make_prediction_processor()
