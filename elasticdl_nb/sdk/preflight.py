"""Check a job on one minibatch in the caller's process before anything is launched.

It runs the very code a worker runs — load the bundle, build the model, read and feed one
minibatch, one gradient step, the evaluation metrics — so a model function that raises,
a loss of the wrong shape or data the model cannot take fails here, in the caller's
notebook or script, with a message that says which function and which shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.model.contract import ContractError, Mode
from elasticdl_nb.spec import JobSpec

if TYPE_CHECKING:
    from elasticdl_nb.runtime.job_dir import JobDir


class PreflightError(ContractError):
    """The model does not work on one minibatch; nothing was launched."""


def check_job(files: JobDir, spec: JobSpec, sources: dict[str, list[SourceInfo]]) -> None:
    """The one-minibatch check in the Keras the job will run, which it settles
    (`spec.keras_version`): 'auto' is this process's Keras, or Keras 2 when Keras 3
    cannot build the model (code written for Keras 2) and Keras 2 can. The other Keras
    than this process's is checked in a fresh process: TensorFlow's Keras is chosen once
    per process, when it is imported."""
    from elasticdl_nb.keras_flavor import KERAS_2_ONLY, VERSION

    wanted = spec.keras_version
    if wanted in ("auto", VERSION):
        try:
            check_one_batch(files.bundle, spec, sources["data"], sources["prediction_data"])
        except PreflightError as exc:
            if wanted != "auto" or VERSION != "3" or KERAS_2_ONLY not in str(exc):
                raise
            wanted = "2"  # (written for Keras 2: try it there)
        else:
            spec.keras_version = VERSION
            return
    if wanted == "2":
        import importlib.util

        if importlib.util.find_spec("tf_keras") is None:
            raise PreflightError(
                "The model is written for Keras 2 (Keras 3 cannot build it), and tf_keras, "
                "TensorFlow's Keras 2, is not installed: pip install --no-deps "
                f"tf_keras=={_tensorflow_version()} (--no-deps: it asks for the tensorflow "
                "wheel by name)."
            )
    _check_elsewhere(files, wanted)
    spec.keras_version = wanted


def _tensorflow_version() -> str:
    import tensorflow as tf

    return tf.__version__


def _check_elsewhere(files: JobDir, version: str) -> None:
    """`check_one_batch` of the job in `files` in a fresh process running Keras `version`;
    its PreflightError (or ContractError) raised here."""
    import os
    import subprocess
    import sys

    from elasticdl_nb.keras_flavor import LEGACY_ENV, environ_for

    env = {k: v for k, v in os.environ.items() if k != LEGACY_ENV}
    env.update(environ_for(version), TF_CPP_MIN_LOG_LEVEL="3")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "elasticdl_nb.sdk.preflight", str(files.path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=_CHECK_SECONDS,
        )
    except subprocess.TimeoutExpired as exc:
        raise PreflightError(
            f"The one-minibatch check in Keras {version} did not end in {_CHECK_SECONDS} s "
            "(a fresh process: TensorFlow's import, the model built, one step). Its output:"
            f"\n{(exc.stderr or b'')[-3000:]!r}"
        ) from None
    if done.returncode == _REFUSED:
        raise PreflightError(f"(Keras {version}) {done.stderr.strip().splitlines()[-1]}")
    if done.returncode:
        raise PreflightError(
            f"The one-minibatch check in Keras {version} failed:\n{done.stderr[-3000:]}"
        )


def _shape(x) -> str:
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {_shape(v)}" for k, v in x.items()) + "}"
    shape = getattr(x, "shape", None)
    return str(tuple(shape)) if shape is not None else type(x).__name__


def check_one_batch(
    bundle_dir: Path, spec: JobSpec, train: list[SourceInfo], prediction: list[SourceInfo] = ()
) -> dict:
    """Run one training step locally (and, with `prediction` data, one prediction);
    returns {'loss': float, 'variables': int}."""
    import tensorflow as tf

    from elasticdl_nb.model import load_bundle
    from elasticdl_nb.runtime.ps.row_optimizer import RowOptimizer
    from elasticdl_nb.runtime.worker.batches import BatchMaker, first_batch
    from elasticdl_nb.runtime.worker.model_runner import ModelRunner

    def fail(stage: str, exc: BaseException) -> PreflightError:
        return PreflightError(
            f"The model failed the one-minibatch check in {stage}: "
            f"{type(exc).__name__}: {exc}".strip()
        )

    contract = load_bundle(bundle_dir)
    try:
        runner = ModelRunner(contract)
    except ContractError:
        raise
    except Exception as exc:
        raise fail("custom_model()", exc) from exc
    try:
        batch = first_batch(BatchMaker(train, contract, spec), Mode.TRAINING)
    except ContractError:
        raise
    except Exception as exc:
        raise fail("reading the first minibatch (feed or data decoding)", exc) from exc
    try:
        runner.build(batch.features)
        rows = runner.initial_rows(runner.probe_ids(batch.features))
        predictions = runner.forward(batch.features, rows)
    except ContractError:
        raise
    except Exception as exc:
        raise fail(
            f"the model's forward pass on features of shape {_shape(batch.features)}", exc
        ) from exc
    try:
        loss = contract.loss(batch.labels, predictions)
    except Exception as exc:
        raise fail(
            f"loss(labels, predictions) with labels {_shape(batch.labels)} and "
            f"predictions {_shape(predictions)}",
            exc,
        ) from exc
    loss_shape = tuple(tf.convert_to_tensor(loss).shape)
    if loss_shape != ():
        raise PreflightError(
            f"loss(labels, predictions) must return a scalar, but it returned shape {loss_shape} "
            f"for labels {_shape(batch.labels)} and predictions {_shape(predictions)}. This is "
            "usually a broadcasting mistake: reshape the labels to the predictions' shape, and "
            "reduce the per-example losses with tf.reduce_mean."
        )
    _check_export(spec, runner.table_defs)
    try:
        contract.optimizer()
    except Exception as exc:
        raise fail("optimizer()", exc) from exc
    if runner.table_defs and not RowOptimizer.supports(contract.optimizer):
        raise PreflightError(
            f"{type(contract.optimizer()).__name__} keeps state that is not one value per "
            "parameter, so it cannot update embedding rows one by one on the parameter "
            "servers: use SGD, Adam, Adagrad, RMSprop or another per-parameter optimizer."
        )
    _check_callbacks(bundle_dir, contract, spec)
    try:
        grads = runner.train_step(batch.features, batch.labels, rows=rows)
        runner.eval_step(batch.features, batch.labels, rows)
    except ContractError:
        raise
    except Exception as exc:
        raise fail("a gradient step or the evaluation metrics", exc) from exc
    if not runner.dense_vars and not runner.table_defs:
        raise PreflightError("The model has no trainable variables: there is nothing to train.")
    if prediction:
        _check_prediction(BatchMaker(list(prediction), contract, spec), runner, fail)
    return {"loss": grads.loss, "variables": len(runner.dense_vars) + len(runner.table_defs)}


def _check_prediction(maker, runner, fail) -> None:
    """The prediction data's first minibatch through the model, and its processor made."""
    from elasticdl_nb.runtime.worker.batches import first_batch

    try:
        batch = first_batch(maker, Mode.PREDICTION)
    except ContractError:
        raise
    except Exception as exc:
        raise fail("reading the prediction data's first minibatch", exc) from exc
    try:
        runner.forward(batch.features, runner.initial_rows(runner.probe_ids(batch.features)))
    except Exception as exc:
        raise fail(
            f"predicting for the prediction data's features of shape {_shape(batch.features)} "
            "(they must be what the model takes: the training data's features without labels)",
            exc,
        ) from exc
    try:
        runner.contract.make_prediction_processor()
    except ContractError:
        raise
    except Exception as exc:
        raise fail("making the PredictionOutputsProcessor", exc) from exc


def _check_export(spec: JobSpec, tables: list) -> None:
    """A SavedModel holds the model whole: not one whose tables are exported as files."""
    from elasticdl_nb.runtime.worker.export import (
        WHOLE_TABLES_MAX_BYTES,
        too_large_to_export,
        whole_tables_bytes,
    )

    if spec.export_format == "keras" or whole_tables_bytes(tables) <= WHOLE_TABLES_MAX_BYTES:
        return
    names = ", ".join(repr(t.name) for t in tables)
    raise PreflightError(
        f"export_format={spec.export_format!r} asks for a TensorFlow SavedModel, which holds "
        f"the whole model, but its embedding tables ({names}) {too_large_to_export(tables)}. "
        "Such tables are exported by the parameter servers as (id, vector) files instead "
        "(elasticdl_nb.load_embeddings reads them). Use export_format='keras' (the default), "
        "or give the tables an input_dim small enough to be exported whole."
    )


def _check_callbacks(bundle_dir: Path, contract, spec: JobSpec) -> None:
    """Refuse callbacks a job's master cannot call, and list them in the bundle (a job
    without any then never loads TensorFlow in its master for them)."""
    import json

    from elasticdl_nb.runtime.master.callbacks import CALLBACKS_FILE, check_callbacks

    try:
        callbacks = list(contract.callbacks()) if contract.callbacks else []
    except Exception as exc:
        raise PreflightError(f"callbacks() raised {type(exc).__name__}: {exc}") from exc
    try:
        names = check_callbacks(callbacks, contract.optimizer())
    except ValueError as exc:
        raise PreflightError(str(exc)) from None
    (bundle_dir / CALLBACKS_FILE).write_text(json.dumps(names))


_REFUSED = 3  # the exit code of a check that refused the model (its message last)
_CHECK_SECONDS = 600  # (a fresh process's check; a model that takes longer is not sane)


def _main(argv: list[str]) -> int:
    """`python -m elasticdl_nb.sdk.preflight JOB_DIR`: the check of a prepared job."""
    import json
    import sys

    from elasticdl_nb.runtime.job_dir import JobDir

    files = JobDir(Path(argv[0]))
    spec = files.read_spec()
    raw = json.loads(files.sources.read_text())
    sources = {k: [SourceInfo.from_dict(s) for s in v] for k, v in raw.items()}
    try:
        check_one_batch(files.bundle, spec, sources["train"], sources.get("prediction", []))
    except ContractError as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        return _REFUSED
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
