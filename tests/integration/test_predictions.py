"""Jobs that predict for a data set once trained (issue 38, ElasticDL's prediction jobs):
real jobs on the local backend, their predictions read back with `job.predictions()` and
compared with the exported model's own on the same data; a worker SIGKILLed while the job
predicts, or the master, leaves every record with exactly one prediction."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import elasticdl_nb as edl
from tests.integration.faults import fault_rng, pid_of, wait_for
from tests.integration.models import DIGITS, custom_model, digits_split

# A model-zoo module in ElasticDL's style: its processor by ElasticDL's base class and
# name, each call's predictions saved where the test finds them, each call slowed so a
# worker can be killed while the job predicts.
ZOO_MODULE = """
import json
import os
import uuid

import keras
import numpy as np
import tensorflow as tf
from elasticdl.python.common.constants import Mode
from elasticdl.python.worker.prediction_outputs_processor import BasePredictionOutputsProcessor

SEEN = {seen!r}
PAUSE = {pause!r}


def custom_model():
    inputs = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden))


def feed(dataset, mode, metadata):
    if mode == Mode.PREDICTION:
        return dataset.map(lambda x: {{"pixels": x}})
    return dataset.map(lambda x, y: ({{"pixels": x}}, y))


def loss(labels, predictions):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return keras.optimizers.Adam(0.005)


class PredictionOutputsProcessor(BasePredictionOutputsProcessor):
    def process(self, predictions, worker_id):
        import time

        time.sleep(PAUSE)
        np.save(os.path.join(SEEN, f"{{worker_id}}-{{uuid.uuid4().hex}}.npy"), predictions)
"""


def _zoo(tmp_path, pause: float):
    seen = tmp_path / "seen"
    seen.mkdir()
    zoo = tmp_path / "digits_predict.py"
    zoo.write_text(textwrap.dedent(ZOO_MODULE.format(seen=str(seen), pause=pause)))
    return zoo, seen


def _zoo_job(zoo, data, prediction_data, epochs: int):
    """The zoo module's job: 2 workers, tasks of two minibatches of 32."""
    return edl.train(
        "digits_predict.custom_model",
        model_zoo=str(zoo),
        data=data,
        prediction_data=prediction_data,
        workers=2,
        epochs=epochs,
        minibatch_size=32,
        minibatches_per_task=2,
    )


def _processed(seen) -> np.ndarray:
    return np.concatenate([np.load(p) for p in sorted(seen.iterdir())])


def _same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a and b hold the same rows, in any order (processors see minibatches as
    workers make them)."""
    order = lambda m: m[np.lexsort(np.round(m, 4).T[::-1])]  # noqa: E731
    return a.shape == b.shape and np.allclose(order(a), order(b), atol=1e-4)


def test_a_model_zoo_job_predicts_its_data_and_its_processor_sees_every_record(job_home, tmp_path):
    zoo, seen = _zoo(tmp_path, pause=0.0)
    (x, y), (xt, yt) = digits_split()
    job = _zoo_job(zoo, (x, y), xt, epochs=6)
    assert job.wait(timeout=300)["state"] == "succeeded"
    predictions = job.predictions()
    assert predictions.shape == (len(xt), 10)
    # What the job predicted is what its exported model predicts for the same records.
    np.testing.assert_allclose(predictions, job.model().predict(xt, verbose=0), atol=1e-4)
    assert float(np.mean(predictions.argmax(1) == yt)) >= 0.9
    # Its processor was given every minibatch once (no worker was lost).
    assert _same_rows(_processed(seen), predictions)
    phases = [e.data["phase"] for e in job.events(follow=False) if e.kind == "phase"]
    assert phases.index("predicting") == phases.index("evaluating") + 1
    assert phases.index("exporting") == phases.index("predicting") + 1


def test_an_allreduce_job_predicts_with_its_replicas(job_home):
    (x, y), (xt, yt) = digits_split()
    job = edl.train(
        custom_model,
        **DIGITS,
        data=(x, y),
        prediction_data=xt,
        strategy="allreduce",
        workers=2,
        epochs=4,
        minibatch_size=32,
    )
    assert job.wait(timeout=300)["state"] == "succeeded"
    predictions = job.predictions()
    np.testing.assert_allclose(predictions, job.model().predict(xt, verbose=0), atol=1e-4)
    assert float(np.mean(predictions.argmax(1) == yt)) >= 0.9


@pytest.mark.parametrize("role", ["worker", "master"])
def test_a_process_sigkilled_while_the_job_predicts_costs_no_record_its_prediction(
    job_home, tmp_path, role
):
    # A worker's tasks are given to the other; a master's successor replays the journal
    # into the predicting phase and the same workers go on.
    rng = fault_rng(f"predicting-{role}-kill")
    zoo, seen = _zoo(tmp_path, pause=0.1)
    (x, y), (xt, _) = digits_split()
    big = np.concatenate([xt] * 4)  # 1,588 records: 25 tasks of 64, ~0.1 s a minibatch
    job = _zoo_job(zoo, (x, y), big, epochs=2)

    def predicting():
        return any(
            e.kind == "phase" and e.data["phase"] == "predicting" for e in job.events(follow=False)
        )

    wait_for(predicting, 240, "the predicting phase")
    time.sleep(rng.uniform(0.2, 1.5))
    if role == "worker":
        victim = rng.randrange(2)
        os.kill(pid_of(job.status(), "worker", victim), signal.SIGKILL)
        print(f"killed worker {victim} while predicting")

        def lost(kind, data) -> bool:
            ended = (data.get("role"), data.get("id"), data.get("kind"))
            return kind == "instance" and ended == ("worker", victim, "killed")

    else:
        master = json.loads((Path(job.dir) / "master.json").read_text())["pid"]
        os.kill(master, signal.SIGKILL)
        print(f"killed the master (pid {master}) while predicting")

        def lost(kind, data) -> bool:
            return kind == "master_restarted"

    assert job.wait(timeout=300)["state"] == "succeeded"
    events = list(job.events(follow=False))
    kinds = [(e.kind, e.data) for e in events]
    killed = next(i for i, (kind, data) in enumerate(kinds) if lost(kind, data))
    done = next(i for i, (kind, _) in enumerate(kinds) if kind == "predictions")
    assert killed < done, f"the {role} was killed after the job had predicted"
    if role == "master":
        restarted = kinds[killed][1]
        assert restarted["incarnation"] == 1
        phases = [d["phase"] for k, d in kinds[killed:] if k == "phase"]
        assert phases[:1] != ["training"], "the new master went back to training"
    # Every record has exactly one prediction, the exported model's.
    predictions = job.predictions()
    assert predictions.shape == (len(big), 10)
    np.testing.assert_allclose(predictions, job.model().predict(big, verbose=0), atol=1e-4)
    # Each task finished once; the processor saw every record (a redone minibatch twice).
    finished = [(d["source"], d["start"]) for k, d in kinds if k == "prediction_task"]
    assert len(finished) == len(set(finished)) == 25
    assert len(_processed(seen)) >= len(big)
