"""`train`, `attach` and `jobs`: the SDK's entry points.

`train` turns its arguments into one validated `JobSpec`, writes the model bundle,
resolves the data (through the model's own `custom_data_reader` when it has one), checks
the model on one minibatch in this process, and only then starts the job. Anything wrong
is reported before a single process is launched (and the job directory made for it is
removed). Its steps are the functions below it, in order.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elasticdl_nb.backends import backend_names, get_backend, job_records
from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.capture import write_bundle
from elasticdl_nb.data import DataError, SourceInfo, resolve_sources, stage_arrays
from elasticdl_nb.sdk.errors import IdleWorkersWarning, JobNotFound
from elasticdl_nb.sdk.job import Job
from elasticdl_nb.sdk.model_source import functions_of
from elasticdl_nb.spec import JobSpec, SpecError

if TYPE_CHECKING:
    from elasticdl_nb.backends import Backend
    from elasticdl_nb.runtime.job_dir import JobDir

_ARRAYS_PLACEHOLDER = "<in-memory arrays>"
# Each data option: where its arrays are staged under the job's data/, and its sources'
# key in sources.json.
_STAGED_AS = {"data": "train", "validation_data": "validation", "prediction_data": "prediction"}


def _is_arrays(data: Any) -> bool:
    if isinstance(data, np.ndarray | dict):
        return True
    return isinstance(data, tuple) and len(data) == 2 and not all(isinstance(p, str) for p in data)


def _default_name(model: Any, spec: JobSpec) -> str:
    if spec.model_def:
        base = spec.model_def.split(".")[0]
    else:
        base = getattr(model, "__name__", None) or getattr(model, "name", "job")  # a Keras model
    base = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:20] or "job"
    return f"{base}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def train(
    model: Any = None,
    *,
    data: Any,
    validation_data: Any = None,
    prediction_data: Any = None,
    loss: Callable | None = None,
    optimizer: Callable | None = None,
    feed: Callable | None = None,
    eval_metrics_fn: Callable | None = None,
    callbacks: Callable | list | None = None,
    prediction_outputs_processor: Any = None,
    custom_data_reader: Callable | None = None,
    check: bool = True,
    dry_run: bool = False,
    **options: Any,
) -> Job | str:
    """Start an elastic training job and return its `Job` at once (it does not block).
    With `dry_run=True` nothing is started: it returns, as YAML, every Kubernetes object
    the job would create (`backend='kubernetes'`).

    model: 'module.custom_model' (with model_zoo=...), a model-zoo module, a dict of the
        contract's functions, or the custom_model function (then loss=, optimizer=, ...).
    data, validation_data: CSV/TFRecord paths or globs, or in-memory (x, y) arrays.
    prediction_data: the same forms (arrays: x alone), predicted for once trained:
        `job.predictions()` returns them in the data's order, and each worker gives each
        minibatch's to `prediction_outputs_processor` (a class with `process(predictions,
        worker_id)`, ElasticDL's PredictionOutputsProcessor), if given.
    custom_data_reader: ElasticDL's, for data in a form of the model's own: each data
        option is then one data origin it is made for (data_reader_params= its kwargs).
    options: any JobSpec option (workers=, ps=, epochs=, minibatch_size=, ...).
    check: run one training step here first (recommended).
    """
    given = {"data": data, "validation_data": validation_data, "prediction_data": prediction_data}
    spec = _job_spec(model, given, options)
    backend = _backend(spec, dry_run)
    functions = _model_functions(
        model,
        spec,
        {
            "loss": loss,
            "optimizer": optimizer,
            "feed": feed,
            "eval_metrics_fn": eval_metrics_fn,
            "callbacks": _callbacks_function(callbacks),
            "prediction_outputs_processor": prediction_outputs_processor,
            "custom_data_reader": custom_data_reader,
        },
    )
    record = job_records.create_job(spec.name or _default_name(model, spec), spec.backend)
    try:
        _write_bundle(record, spec, functions)
        reader = _custom_data_reader(record.files.bundle, functions)
        sources = {
            option: _sources(spec, option, value, record.files, reader)
            for option, value in given.items()
        }
        _write_job_dir(record, spec, sources)
        _warn_of_idle_workers(spec, sources["data"])
        if check:
            from elasticdl_nb.sdk.preflight import check_job

            check_job(record.files, spec, sources)  # (settles keras_version)
        elif spec.keras_version == "auto":
            from elasticdl_nb.keras_flavor import VERSION

            spec.keras_version = VERSION
        record.files.spec.write_text(spec.to_json())
        if dry_run:
            return _dry_run(backend, spec, record)
        backend.submit(spec, record)
    except BaseException:
        shutil.rmtree(record.dir, ignore_errors=True)  # nothing was launched: leave no trace
        raise
    return Job(record)


def _warn_of_idle_workers(spec: JobSpec, train: list[SourceInfo]) -> None:
    """Warn (IdleWorkersWarning) when the job may run more workers than an epoch has
    tasks, and say which minibatches_per_task would give each of them one."""
    counts = [source.num_records for source in train]
    tasks = spec.tasks_per_epoch(counts)
    if spec.workers <= tasks:
        return
    fix = next(
        (
            f"minibatches_per_task={n} makes {spec.tasks_per_epoch(counts, n)} tasks an epoch"
            for n in range(spec.minibatches_per_task - 1, 0, -1)
            if spec.tasks_per_epoch(counts, n) >= spec.workers
        ),
        f"even tasks of one minibatch are {spec.tasks_per_epoch(counts, 1)}: use fewer workers",
    )
    warnings.warn(
        f"workers={spec.workers}, but an epoch of this data is {tasks} task(s) "
        f"({sum(counts):,} records in tasks of {spec.minibatches_per_task} minibatches of "
        f"{spec.minibatch_size}), and an epoch's tasks are handed out once the epoch before "
        f"is done: at most {tasks} worker(s) train at once while the others wait, holding "
        f"what they were given. Fix: {fix}.",
        IdleWorkersWarning,
        stacklevel=3,
    )


def _job_spec(model: Any, given: dict[str, Any], options: dict) -> JobSpec:
    """The validated spec of `train`'s arguments (`given`: each data option's value);
    in-memory arrays stand in as a placeholder until they are staged into the job
    directory."""
    if given["data"] is None:
        raise SpecError(
            "No training data: pass data= (CSV or TFRecord paths or globs, or "
            "in-memory (x, y) arrays)."
        )
    if isinstance(model, str):
        options.setdefault("model_def", model)
    return JobSpec.from_options(
        **options,
        **{
            option: [_ARRAYS_PLACEHOLDER] if _is_arrays(value) else value
            for option, value in given.items()
        },
    )


def _backend(spec: JobSpec, dry_run: bool) -> Backend:
    """The job's backend, once it has completed the spec (`Backend.complete`)."""
    backend = get_backend(spec.backend)
    backend.complete(spec)
    if dry_run and not backend.can_dry_run:
        able = [n for n in backend_names() if get_backend(n).can_dry_run]
        raise SpecError(
            f"--dry-run shows the objects a job would create, and a {backend.name} job "
            f"creates none: add --backend {' or '.join(able)}."
        )
    return backend


def _model_functions(model: Any, spec: JobSpec, given: dict[str, Any]) -> dict | None:
    """The contract's functions from `model` and the ones given beside it; None for a
    model-zoo module named by `model_def` (it travels as source)."""
    functions = functions_of(model, given)
    if functions is None and not spec.model_def:
        raise SpecError(
            "No model: pass the custom_model function (with loss= and optimizer=), "
            "a dict of the model functions, or model_def='module.custom_model' "
            "with model_zoo='path'."
        )
    return functions


def _custom_data_reader(bundle: Path, functions: dict | None) -> Callable | None:
    """The model's `custom_data_reader`, if it has one: the given functions', or the
    model-zoo module's (loaded here only when its files define one at their top level)."""
    if functions is not None:
        return functions.get("custom_data_reader")
    if not any(_defines(path, "custom_data_reader") for path in bundle.rglob("*.py")):
        return None
    from elasticdl_nb.model import load_bundle

    return load_bundle(bundle).custom_data_reader


def _defines(path: Path, name: str) -> bool:
    """Whether a Python file binds `name` at its top level (a def, a class, an import or
    an assignment)."""
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, UnicodeDecodeError):
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def _sources(
    spec: JobSpec, option: str, given: Any, files: JobDir, reader: Callable | None
) -> list[SourceInfo]:
    """The sources of a data option: the model's own reader's shards, files, or the
    arrays given, staged into the job directory."""
    from elasticdl_nb.model.custom_data_reader import custom_sources, data_origin, reader_params

    if given is None:
        return []
    if reader is not None:
        if _is_arrays(given):
            raise DataError(
                f"{option}= got arrays, and the model reads its data with its "
                "custom_data_reader: pass the data origin it reads (e.g. a path), or drop "
                "custom_data_reader to train on arrays."
            )
        origin = data_origin(option, getattr(spec, option))
        params = reader_params(spec.data_reader_params)
        return custom_sources(reader, option, origin, spec.records_per_task, params)
    if _is_arrays(given):
        return _staged_sources(spec, option, given, files)
    return _file_sources(spec, option)


def _file_sources(spec: JobSpec, option: str) -> list[SourceInfo]:
    """The sources of the files given as `option`."""
    return resolve_sources(
        getattr(spec, option),
        data_format=spec.data_format,
        csv_header=spec.csv_header,
        csv_delimiter=spec.csv_delimiter,
    )


def _staged_sources(spec: JobSpec, option: str, arrays: Any, files: JobDir) -> list[SourceInfo]:
    """Write the arrays given as `option` into the job directory; the spec names them."""
    staged = stage_arrays(*_xy(arrays, option), str(files.data / _STAGED_AS[option]))
    setattr(spec, option, [staged])
    return resolve_sources([staged], "npy")


def _write_bundle(record: JobRecord, spec: JobSpec, functions: dict | None) -> None:
    """The model bundle, as the job's processes (and the check here) load it."""
    write_bundle(
        record.files.bundle,
        model_zoo=spec.model_zoo,
        model_def=spec.model_def,
        functions=functions,
        limit=spec.bundle_limit_mb * 2**20,
    )


def _write_job_dir(record: JobRecord, spec: JobSpec, sources: dict) -> None:
    """The spec and the data's sources, as the job's processes read them."""
    files = record.files
    spec.name = record.name
    spec.validate()
    files.spec.write_text(spec.to_json())
    files.sources.write_text(
        json.dumps(
            {
                key: [s.to_dict() for s in sources[option]]
                for option, key in _STAGED_AS.items()
                if option != "prediction_data" or sources[option]  # (none: as before it)
            }
        )
    )


def _dry_run(backend: Backend, spec: JobSpec, record: JobRecord) -> str:
    """The YAML of what the job would create; the prepared job directory goes."""
    try:
        return backend.dry_run(spec, record)
    finally:
        shutil.rmtree(record.dir, ignore_errors=True)


def _callbacks_function(callbacks: Callable | list | None) -> Callable | None:
    """`callbacks=[...]` as the contract's `callbacks()` (which returns a fresh list)."""
    if callbacks is None or callable(callbacks):
        return callbacks
    given = list(callbacks)

    def job_callbacks():
        return list(given)

    return job_callbacks


def _xy(data: Any, option: str) -> tuple[Any, Any]:
    if isinstance(data, tuple):
        return data
    if option == "prediction_data":
        return data, None  # (features alone: what is predicted needs no labels)
    raise DataError(
        f"{option}= got arrays without labels: pass ({option.split('_')[0]}_x, labels) as a tuple."
    )


def attach(name: str, namespace: str | None = None, kubeconfig: str = "") -> Job:
    """The `Job` of an existing job, running or finished, by name. With `namespace`, a
    Kubernetes job that another notebook started is found there by its labels."""
    record = job_records.find_job(name)
    if record is None and namespace:
        for backend in map(get_backend, backend_names()):
            record = backend.find_job(name, namespace, kubeconfig)
            if record is not None:
                break
    if record is None:
        known = [r.name for r in job_records.all_jobs()]
        where = f"in namespace {namespace!r} or " if namespace else ""
        raise JobNotFound(
            f"No job named {name!r} {where}under {job_records.jobs_root()}. Known jobs: "
            f"{', '.join(known[-10:]) or 'none'}."
            + ("" if namespace else " (A Kubernetes job from elsewhere: pass namespace=.)")
        )
    return Job(record)


def jobs(namespace: str | None = None, kubeconfig: str = "") -> list[dict]:
    """Every job this machine knows, newest last: name, backend, state (a
    `vocabulary.JobState`), creation time and directory. With `namespace`, also the jobs
    there that other notebooks started (`remote`: True; their `dir` is '')."""
    out = []
    for record in job_records.all_jobs():
        final = record.final_state
        state = final["state"] if final else Job(record).status().get("state")
        out.append(
            {
                "name": record.name,
                "backend": record.backend,
                "state": state,
                "created": record.created,
                "dir": str(record.dir),
                "remote": False,
            }
        )
    if namespace:
        known = {j["name"] for j in out}
        for backend in map(get_backend, backend_names()):
            for found in backend.find_jobs(namespace, kubeconfig):
                if found.name not in known:
                    out.append(
                        {
                            "name": found.name,
                            "backend": found.backend,
                            "state": found.state,
                            "created": found.created,
                            "dir": "",
                            "remote": True,
                        }
                    )
    return out
