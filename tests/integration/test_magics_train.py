"""`%%elasticdl train` and `%elasticdl config` in a real IPython shell, with real jobs."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import numpy as np
import pytest

from elasticdl_nb.spec import JobSpec
from tests.conftest import job_processes
from tests.integration.faults import wait_for
from tests.integration.models import COMPILED_MODEL, digits_split


@pytest.fixture(scope="module")
def shell(ipython_shell):
    ip = ipython_shell
    (x, y), (xt, yt) = digits_split()
    ip.user_ns.update(x_train=x, y_train=y, x_test=xt, y_test=yt)
    return ip


@pytest.fixture()
def defaults(shell):
    yield
    shell.run_line_magic("elasticdl", "config --reset")


def train(shell, line: str, cell: str):
    # A fresh notebook: model functions an earlier test's cell defined are not around
    # (in a real notebook they would be, and would be used: the summary line lists them).
    for name in (
        "custom_model",
        "loss",
        "optimizer",
        "model",
        "feed",
        "eval_metrics_fn",
        "callbacks",
    ):
        shell.user_ns.pop(name, None)
    return shell.run_cell_magic("elasticdl", "train " + line, textwrap.dedent(cell))


def jobs_made(job_home) -> list[str]:
    jobs = job_home / "jobs"
    return sorted(p.name for p in jobs.iterdir()) if jobs.exists() else []


@pytest.mark.slow
def test_a_compiled_model_in_the_cell_trains_with_the_notebook_defaults_and_flags(
    shell, job_home, defaults, capsys
):
    shell.run_line_magic("elasticdl", "config workers=1 minibatch_size=32")
    shell.run_line_magic("config", "ElasticDL.epochs = 4")
    out = capsys.readouterr().out
    assert "workers" in out and "(default 2)" in out

    train(
        shell,
        "--workers 2 --data x_train y_train --validation-data x_test y_test -o trained --wait",
        COMPILED_MODEL,
    )
    out = capsys.readouterr().out
    assert "Started job" in out and "Keras model: model" in out
    job = shell.user_ns["trained"]
    status = job.status()
    assert status["state"] == "succeeded", status
    assert status["metrics"]["accuracy"] >= 0.85
    spec = JobSpec.from_json((job.dir / "spec.json").read_text())
    # The flag wins over the default; the defaults fill in the rest.
    assert (spec.workers, spec.epochs, spec.minibatch_size) == (2, 4, 32)
    # The cell ran here too: the model stays usable in the notebook.
    assert shell.user_ns["model"].count_params() == 64 * 64 + 64 + 64 * 10 + 10
    assert job_processes(job_home) == []

    # Reattached later (a new kernel has nothing but the name), a dashboard rebuilds the
    # whole history from the journal.
    from elasticdl_nb.widgets import Dashboard

    attached = shell.run_line_magic("elasticdl", f"attach {job.name}")
    dashboard = Dashboard(attached)
    assert dashboard.join(60) and dashboard.error is None
    view = dashboard.view
    assert view.state == "succeeded" and view.records_done() == view.records_total() == 1400
    assert len(view.loss.xy()[0]) == len(job.metrics()["loss"]) == 4 * -(-1400 // 32)
    assert [r.role for r in view.rows()].count("worker") == 2
    evaluations = [e for e in job.events(follow=False) if e.kind == "evaluation"]
    assert len(view.metrics["accuracy"].xy()[0]) == len(evaluations) == 4


def _interrupt_once_training(job_home) -> threading.Thread:
    """Press Ctrl-C (SIGINT to this process) once a job under `job_home` has trained a
    few steps: by then the magic is blocked in its --wait."""
    import elasticdl_nb as edl

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = [j for j in edl.jobs() if j["state"] == "running"]
            if running and edl.attach(running[0]["name"]).status().get("step", 0) >= 3:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_the_allreduce_strategy_from_the_magic(shell, job_home):
    # A cell's list of callbacks is the job's, as for fit; the export is a SavedModel too.
    cell = COMPILED_MODEL + (
        "    callbacks = [keras.callbacks.LearningRateScheduler(lambda e, lr: 0.004 / (e + 1))]\n"
    )
    train(
        shell,
        "--strategy allreduce --workers 3 --epochs 6 --minibatch-size 32 --data x_train "
        "y_train --validation-data x_test y_test --export-format both -o ring --wait",
        cell,
    )
    job = shell.user_ns["ring"]
    status = job.status()
    assert status["state"] == "succeeded", status
    assert status["metrics"]["accuracy"] >= 0.90
    assert status["strategy"] == "allreduce" and status["group"]["members"] == [0, 1, 2]
    assert [i["role"] for i in status["instances"]] == ["worker"] * 3
    rates = [e.data["rate"] for e in job.events(follow=False) if e.kind == "learning_rate"]
    assert rates == pytest.approx([0.004 / (e + 1) for e in range(6)])
    (_, _), (x_test, _) = digits_split()
    served = job.saved_model()
    np.testing.assert_allclose(
        served.serve(x_test[:40]).numpy(), job.model().predict(x_test[:40], verbose=0), atol=1e-5
    )


ELASTICDL_CELL = """
import keras
import tensorflow as tf
from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.callbacks import MaxStepsStopping
from elasticdl.python.elasticdl.layers.embedding import Embedding

def custom_model():
    pixels = keras.Input(shape=(64,))
    # Each pixel's value (0-16, scaled to [0, 1] here) at each position is an id.
    values = keras.ops.cast(keras.ops.round(pixels * 16), "int64")
    ids = values + keras.ops.arange(64, dtype="int64") * 17
    vectors = Embedding(4, input_dim=64 * 17, name="pixel_values")(ids)
    return keras.Model(pixels, keras.layers.Dense(10)(keras.layers.Flatten()(vectors)))

def loss(labels, predictions):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )

def optimizer():
    return keras.optimizers.Adam(0.02)

def eval_metrics_fn():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

def callbacks():
    assert Mode.TRAINING == "training"
    return [MaxStepsStopping(max_steps=150)]
"""


def test_a_cell_written_for_elasticdl_trains_with_its_import_paths(shell, job_home):
    """ElasticDL's `Embedding`, `Mode` and callbacks imported by their ElasticDL paths in
    a notebook cell (the import hook elasticdl_nb installs), trained through the magic."""
    train(
        shell,
        "--workers 2 --epochs 20 --minibatch-size 32 --data x_train y_train "
        "--validation-data x_test y_test -o zoo --wait",
        ELASTICDL_CELL,
    )
    job = shell.user_ns["zoo"]
    status = job.status()
    assert status["state"] == "succeeded", status
    # MaxStepsStopping, by its ElasticDL path, stopped it (the tasks running then finish).
    [stopped] = [e.data for e in job.events(follow=False) if e.kind == "training_stopped"]
    assert "MaxStepsStopping" in stopped["reason"] and stopped["step"] >= 150
    assert status["step"] < 20 * 1400 // 32 // 2
    assert status["metrics"]["accuracy"] >= 0.85
    tables = [e.data["tables"] for e in job.events(follow=False) if e.kind == "tables"]
    print("tables:", tables[-1])
    assert list(tables[-1]) == ["pixel_values/embeddings"]
    assert tables[-1]["pixel_values/embeddings"]["rows"] <= 64 * 17  # ids seen, on the PS
    # With an input_dim the table comes back whole in the exported model, which runs here.
    model = job.model()
    layer = model.get_layer("pixel_values")
    assert type(layer).__name__ == "Embedding" and layer.embeddings.shape == (64 * 17, 4)
    (_, _), (x_test, y_test) = digits_split()
    predicted = np.argmax(model.predict(x_test, verbose=0), axis=1)
    assert np.mean(predicted == y_test) == pytest.approx(status["metrics"]["accuracy"], abs=0.01)


@pytest.mark.slow
def test_interrupting_the_wait_detaches_and_the_job_goes_on_until_stopped(shell, job_home, capsys):
    interrupter = _interrupt_once_training(job_home)
    train(
        shell,
        "--workers 1 --epochs 50 --minibatch-size 16 --data {'x_train'} y_train -o running --wait",
        """
        import tensorflow as tf
        import keras
        import time
        PAUSE = 0.02

        def custom_model():
            return keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])

        def loss(labels, predictions):
            time.sleep(PAUSE)  # slow enough to still be running when interrupted
            return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, predictions, from_logits=True))

        def optimizer():
            return keras.optimizers.SGD(0.1)
        """,
    )
    interrupter.join(5)
    out = capsys.readouterr().out
    assert "source: custom_model, loss, optimizer" in out and "PAUSE" in out
    job = shell.user_ns["running"]
    # Text progress while it waited (no widget front end in a terminal shell), then the
    # interrupt only detached.
    assert f"[{job.name}] scaling workers 0 -> 1" in out
    assert f"Detached from {job.name}, which goes on" in out
    step = job.status()["step"]
    wait_for(lambda: job.status()["step"] > step, 60, "more steps after the interrupt")
    assert shell.run_line_magic("elasticdl", f"stop {job.name} -f")["state"] == "stopped"
    wait_for(lambda: job_processes(job_home) == [], 30, "no process left")


@pytest.mark.parametrize(
    "cell, expected",
    [
        ("def custom_model(:\n    pass\n", "the cell raised an error"),
        ("model = undefined_name\n", "the cell raised an error"),
        (
            "import keras\nmodel = keras.Sequential([keras.Input((3,)), keras.layers.Dense(10)])\n"
            "model.compile(optimizer='sgd', loss='sparse_categorical_crossentropy')\n",
            "failed the one-minibatch check",
        ),
        (
            "import keras\nLOG = open('/dev/null', 'w')\n"
            "def custom_model():\n    LOG.write('building')\n"
            "    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])\n"
            "def loss(labels, predictions):\n    return keras.ops.mean(predictions)\n"
            "def optimizer():\n    return keras.optimizers.SGD(0.1)\n",
            "Cannot capture 'LOG' (used by custom_model): it is an open file",
        ),
        ("x = 1\n", "The cell defines no model"),
    ],
    ids=["syntax-error", "undefined-name", "fails-on-one-batch", "uncapturable", "no-model"],
)
def test_a_bad_cell_gets_a_clear_error_and_no_job(shell, job_home, capsys, cell, expected):
    train(shell, "--data x_train y_train", cell)
    captured = capsys.readouterr()
    assert expected in captured.out + captured.err
    assert jobs_made(job_home) == []


def test_help_prints_the_usage_a_bad_flag_one_line_and_no_traceback(shell, capsys):
    train(shell, "-h", "pass")
    out = capsys.readouterr().out
    assert "usage: %%elasticdl train" in out and "--workers" in out and "-o NAME" in out

    train(shell, "--wrokers 2", "pass")
    err = capsys.readouterr().err
    assert err == "%%elasticdl train: unknown option --wrokers: did you mean --workers?\n"

    shell.run_line_magic("elasticdl", "train --workers 2")
    assert "train is a cell magic" in capsys.readouterr().out

    shell.run_line_magic("elasticdl", "config workers=lots")
    err = capsys.readouterr().err
    assert "Cannot set workers to 'lots'" in err

    shell.run_line_magic("elasticdl", "config --help")
    assert "OPTION=VALUE" in capsys.readouterr().out


def test_dry_run_prints_the_kubernetes_objects_and_launches_nothing(shell, job_home, capsys):
    import yaml

    train(shell, "--backend kubernetes --dry-run --data x_train y_train", COMPILED_MODEL)
    out = capsys.readouterr().out
    objects = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objects[:4]] == ["Job", "Service", "ConfigMap", "Secret"]
    # The compiled Keras model travels in the ConfigMap as its .keras archive.
    assert "bundle__source__models__model.keras" in objects[2]["binaryData"]
    assert jobs_made(job_home) == []


KERAS_2_CELL = """
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import backend as K

def custom_model():
    pixels = keras.Input(shape=(64,))
    top, bottom = tf.split(pixels, 2, axis=1)
    halves = [keras.layers.Dense(32, activation="relu")(h) for h in (top, bottom)]
    return keras.Model(pixels, keras.layers.Dense(10)(K.concatenate(halves, axis=1)))

def loss(labels, predictions):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )

def optimizer():
    return keras.optimizers.Adam(learning_rate=0.005)

def eval_metrics_fn():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
"""


def test_a_cell_written_for_keras_2_trains_in_tf_keras(shell, job_home):
    """A cell whose model only Keras 2 builds (tf.split and K.concatenate on symbolic
    tensors), in this Keras-3 kernel: its `tf.keras` modules travel by TensorFlow's names,
    so the job's processes, found to be Keras 2, take tf_keras's (Keras 3's layers would
    not take tf_keras's tensors)."""
    train(
        shell,
        "--workers 2 --epochs 6 --minibatch-size 32 --data x_train y_train "
        "--validation-data x_test y_test -o k2 --wait",
        KERAS_2_CELL,
    )
    job = shell.user_ns["k2"]
    status = job.status()
    assert status["state"] == "succeeded", status
    started = next(e.data for e in job.events(follow=False) if e.kind == "job_state")
    assert started["keras"] == "2"
    assert status["metrics"]["accuracy"] >= 0.9
    source = (job.bundle_dir / "source" / "captured_model.py").read_text()
    assert "from tensorflow import keras\n" in source
    assert "import tensorflow.keras.backend as K\n" in source
