"""`JobSpec`: the single source of truth for a job's options.

SDK keyword arguments, CLI flags (and later magic flags) are thin adapters onto this
dataclass: they are generated from its fields, and every check lives in `validate()`,
so an option means the same thing and fails the same way wherever it is given.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from elasticdl_nb.spec.errors import SpecError
from elasticdl_nb.spec.kubernetes import check_kubernetes_options
from elasticdl_nb.vocabulary import Strategy


def worker_range(value: Any) -> tuple[int | None, Any]:
    """(MIN, MAX) of a `workers` value: 3 -> (None, 3), '2:6' or (2, 6) -> (2, 6). A
    value that is neither is passed on (as MAX) for `validate` to refuse by its type."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        low, high = value
    elif isinstance(value, str) and value.strip():
        low, sep, high = value.strip().partition(":")
        if not sep:
            low, high = None, low
        try:
            low, high = (None if low is None else int(low)), int(high)
        except ValueError:
            raise SpecError(
                f"workers={value!r} is not a number of workers: write N (e.g. 3) or "
                "a range MIN:MAX (e.g. 2:6)."
            ) from None
    else:
        return None, value
    if low is not None and isinstance(high, int) and not isinstance(low, bool):
        if not 1 <= low <= high:
            raise SpecError(
                f"workers={value!r}: a range needs 1 <= MIN <= MAX, e.g. workers='2:6'."
            )
    return low, high


def _opt(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    minimum: int | None = None,
    cli: bool = True,
    text: Callable[[Any], Any] | None = None,
) -> Any:
    # `text`: front ends take the option as text (a worker range, "2:6"), not as the
    # field's own type; this function reads that text (raising SpecError), and
    # `from_options` and the notebook's defaults check it with the same function.
    meta = {"help": help, "choices": choices, "minimum": minimum, "cli": cli, "text": text}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


@dataclass
class JobSpec:
    """Everything that defines a training job. Build it with `JobSpec.from_options`."""

    # The model: an ElasticDL model-zoo module, or functions given to the SDK.
    model_def: str = _opt("", "The model function as 'module.custom_model' (with --model-zoo).")
    model_zoo: str = _opt("", "The .py file or directory that holds the model-zoo module.")
    keras_version: str = _opt(
        "auto",
        "The Keras the job runs, in every process: '3', or '2' (tf_keras) for model code "
        "that only Keras 2 runs; 'auto' is the notebook's, or 2 when Keras 3 cannot build "
        "the model and tf_keras can.",
        choices=("auto", "3", "2"),
    )
    bundle_limit_mb: int = _opt(
        100,
        "Largest model bundle in MB: the values, Keras weights and local modules a "
        "notebook's model is captured with.",
        minimum=1,
    )
    # Data.
    data: list[str] = _opt(
        [],
        "Training data: CSV or TFRecord files, globs, or a staged-array "
        "directory. Several may be given.",
    )
    validation_data: list[str] = _opt([], "Evaluation data, in the same forms as --data.")
    prediction_data: list[str] = _opt(
        [],
        "Data to predict for once trained, in the same forms as --data (labels not needed): "
        "the predictions are written to the job's directory (Job.predictions() reads them) "
        "and given to the model's PredictionOutputsProcessor, if it has one.",
    )
    data_format: str = _opt(
        "auto", "How to read the data files.", choices=("auto", "csv", "tfrecord", "npy")
    )
    data_reader_params: str = _opt(
        "",
        "The model's custom_data_reader's keyword arguments, as ElasticDL's: 'key=value;...' "
        "(a value that is a Python literal is that value, else its text).",
    )
    label_column: str = _opt("", "CSV column that holds the label (default: the last column).")
    csv_header: bool = _opt(True, "Whether CSV files start with a header line.")
    csv_delimiter: str = _opt(",", "CSV field separator.")
    # Shape of the job.
    name: str = _opt("", "Job name (lowercase letters, digits, '-'); generated when empty.")
    backend: str = _opt(
        "local",
        "Where the job's processes run: local processes, or pods on a Kubernetes cluster.",
        choices=("local", "kubernetes"),
    )
    workers: int = _opt(
        2,
        "Number of workers, or a range MIN:MAX (e.g. 2:6): the job trains once MIN run, "
        "keeps asking for up to MAX, and yields the ones above MIN to higher priorities "
        "first (elastic scheduling).",
        minimum=1,
        text=worker_range,
    )
    min_workers: int = _opt(
        0,
        "The MIN of a worker range (workers='MIN:MAX' sets it); 0 = a fixed number, "
        "which trains with any that run.",
        minimum=0,
        cli=False,
    )
    scale_policy: str = _opt(
        "max",
        "How a worker range grows: 'max' asks for MAX at once and takes what the scheduler "
        "gives; 'throughput' asks for MIN, then one more worker at a time while the newest "
        "adds at least 5 % samples/s, and gives back one that adds less (PS jobs).",
        choices=("max", "throughput"),
    )
    strategy: str = _opt(
        Strategy.PS.value,
        "How workers share what they learn: 'ps' = parameter servers hold the model and "
        "workers push gradients asynchronously; 'allreduce' = every worker holds a replica "
        "and the group averages gradients each step (synchronous; survives failures "
        "and grows in place, no PS).",
        choices=tuple(Strategy),
    )
    ps: int = _opt(1, "Number of parameter-server processes (the 'ps' strategy only).", minimum=1)
    # Training.
    epochs: int = _opt(1, "Passes over the training data.", minimum=1)
    minibatch_size: int = _opt(64, "Records per gradient step.", minimum=1)
    minibatches_per_task: int = _opt(8, "Minibatches in one task handed to a worker.", minimum=1)
    evaluation_steps: int = _opt(
        0, "Evaluate every N training steps; 0 = after each epoch.", minimum=0
    )
    shuffle: bool = _opt(True, "Shuffle the order of tasks in every epoch.")
    seed: int = _opt(0, "Seed for task shuffling.", minimum=0)
    overlap_communication: bool = _opt(
        False,
        "Send each step's gradients and the pull for the step after next while computing, "
        "so the PS works while the worker computes: faster, but gradients use parameters "
        "one update old (asynchronous SGD already tolerates such staleness).",
    )
    grads_to_wait: int = _opt(
        0,
        "PS only: 0 = asynchronous updates (each push is applied at once); N > 0 = "
        "synchronous (ElasticDL's grads_to_wait): each PS applies the average of N "
        "minibatches' gradients as one version, and refuses a gradient computed on an "
        "older version, which the worker then computes again on the new one.",
        minimum=0,
    )
    lr_scaling: str = _opt(
        "none",
        "Allreduce only: what happens to the learning rate when the group grows or "
        "shrinks. Each step averages the gradients of one minibatch per member, so the "
        "global batch is members x minibatch_size. 'none' keeps the optimizer's learning "
        "rate; 'linear' multiplies it by members / workers (the linear scaling rule).",
        choices=("none", "linear"),
    )
    # Output.
    export_format: str = _opt(
        "keras",
        "What the job exports when it ends: a Keras file (model.keras), a TensorFlow "
        "SavedModel with a serving signature (saved_model/), or both.",
        choices=("keras", "saved_model", "both"),
    )
    tensorboard: bool = _opt(
        True,
        "Write TensorBoard event files (loss, evaluation metrics, records/s, workers, "
        "restarts) under the job directory's tensorboard/ folder.",
    )
    # Fault tolerance.
    checkpoint_steps: int = _opt(
        200, "PS checkpoint every N applied updates (and every epoch).", minimum=1
    )
    keep_checkpoints: int = _opt(3, "Checkpoints kept per PS.", minimum=1)
    max_worker_relaunches: int = _opt(
        5,
        "Relaunches of crashed workers before the job fails "
        "(preempted workers are always relaunched).",
        minimum=0,
    )
    max_ps_relaunches: int = _opt(5, "Relaunches of crashed parameter servers.", minimum=0)
    standby_workers: int = _opt(
        0,
        "Workers kept started and ready (the model built, its step traced) but given no "
        "work, at the lowest priority: one takes a lost worker's place at once instead of "
        "a new one starting ('ps' strategy). Each holds a worker's memory while it waits.",
        minimum=0,
    )
    pending_timeout: int = _opt(
        600,
        "Seconds an instance may wait to be scheduled or started before the job is told: "
        "it goes on with fewer workers; a PS that long pending fails the job.",
        minimum=1,
    )
    journal_compact_every: int = _opt(
        20_000,
        "Compact the job's journal every N events: the master's state is saved as a "
        "snapshot that a master taking the job over starts from, and of the events before "
        "it the journal keeps a thinned sample of the frequent kinds and the rest whole "
        "(docs/events.md). 0 = never (the journal and a takeover grow with the job).",
        minimum=0,
    )
    # Security.
    tls: bool = _opt(
        False,
        "Encrypt a local job's connections (gRPC, the PS bulk channel, the allreduce ring) "
        "with mutual TLS, under certificates made for the job. Kubernetes jobs always do.",
    )
    # Kubernetes (--backend kubernetes); see elasticdl_nb/spec/kubernetes.py.
    kubeconfig: str = _opt(
        "", "The kubeconfig to reach the cluster with (default: $KUBECONFIG, ~/.kube/config)."
    )
    namespace: str = _opt("default", "Kubernetes namespace of the job's objects.")
    image: str = _opt(
        "elasticdl-nb:0.1.0", "Runtime image of the job's pods (built from deploy/Dockerfile)."
    )
    image_pull_policy: str = _opt(
        "IfNotPresent", "When pods pull the image.", choices=("Always", "IfNotPresent", "Never")
    )
    run_as: str = _opt(
        "",
        "UID:GID the job's pods run as. Default: the image's user (1000:1000); from a "
        "notebook that itself runs in a pod, the notebook's own uid and gid, so that a "
        "job's directory on a volume shared between users is its user's only.",
    )
    service_account: str = _opt(
        "elasticdl-nb-master",
        "Service account of the master pod, which creates the others (deploy/rbac.yaml).",
    )
    master_priority_class: str = _opt(
        "elasticdl-nb-high", "Priority class of the master pod ('' for none)."
    )
    ps_priority_class: str = _opt("elasticdl-nb-high", "Priority class of PS pods ('' for none).")
    worker_priority_class: str = _opt(
        "elasticdl-nb-low",
        "Priority class of worker pods ('' for none): lower than PS and master, so the "
        "scheduler preempts workers first, and the job goes on with fewer. With a worker "
        "range, of the first MIN.",
    )
    elastic_worker_priority_class: str = _opt(
        "elasticdl-nb-elastic",
        "Priority class of the workers above a range's MIN ('' for none): the lowest, so "
        "the scheduler preempts them before any job's first MIN.",
    )
    master_resources: str = _opt(
        "cpu=1,memory=1Gi",
        "Master pod's requests, e.g. 'cpu=1,memory=1Gi' (memory is also the limit).",
    )
    ps_resources: str = _opt(
        "cpu=1,memory=2Gi", "Each PS pod's requests (memory is also the limit)."
    )
    worker_resources: str = _opt(
        "cpu=1,memory=2Gi", "Each worker pod's requests (memory is also the limit)."
    )
    max_memory: str = _opt(
        "",
        "The most memory a worker or PS pod is relaunched with after being OOMKilled "
        "(each time it doubles); '' = 4x its request.",
    )
    env: list[str] = _opt([], "Environment variables of every pod, NAME=VALUE.")
    pod_template: str = _opt(
        "",
        "A YAML file of pod fields merged into every pod: node selectors, tolerations, "
        "volumes, annotations, ...",
    )
    shared_volume: str = _opt(
        "",
        "The volume every pod mounts the job directory from: 'pvc:CLAIM' or "
        "'hostPath:/dir' (staged data, checkpoints, journal, exported model).",
    )
    # Verification.
    record_ledger: bool = _opt(
        False,
        "Keep a ledger that proves every record was applied exactly once per epoch "
        "(for tests): per record on the PS, or per minibatch on every allreduce replica.",
    )

    # ------------------------------------------------------------------ building

    @classmethod
    def from_options(cls, **options: Any) -> JobSpec:
        """Build and validate a spec from keyword options; unknown names fail at once."""
        known = {f.name for f in dataclasses.fields(cls)}
        if "workers" in options:
            low, options["workers"] = worker_range(options["workers"])
            if low is not None:
                options["min_workers"] = low
        for key in options:
            if key not in known:
                close = closest(key, known)
                hint = f" Did you mean '{close}'?" if close else ""
                raise SpecError(
                    f"Unknown option '{key}'.{hint} Known options: {', '.join(sorted(known))}."
                )
        spec = cls(**{k: _coerce(k, v) for k, v in options.items()})
        spec.validate()
        return spec

    def validate(self) -> None:
        """Check types, ranges and consistency; raise SpecError naming the option and fix."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            expected = _FIELD_TYPES[f.name]
            if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise SpecError(f"Option '{f.name}' must be an integer, got {value!r}.")
            if expected is bool and not isinstance(value, bool):
                raise SpecError(f"Option '{f.name}' must be True or False, got {value!r}.")
            if expected is str and not isinstance(value, str):
                raise SpecError(f"Option '{f.name}' must be a string, got {value!r}.")
            minimum = f.metadata["minimum"]
            if minimum is not None and value < minimum:
                raise SpecError(
                    f"Option '{f.name}' must be at least {minimum}, got {value}. "
                    + _RANGE_HINTS.get(f.name, "")
                )
            choices = f.metadata["choices"]
            if choices and value not in choices:
                raise SpecError(
                    f"Option '{f.name}' must be one of {', '.join(choices)}; got {value!r}."
                )
        if not self.data:
            raise SpecError("No training data: pass data= (files, a glob, or (x, y) arrays).")
        if self.name and not _NAME.match(self.name):
            raise SpecError(
                f"Job name {self.name!r} is not valid: use at most 52 lowercase "
                "letters, digits and '-', starting and ending with a letter or digit."
            )
        if self.model_zoo and not self.model_def:
            raise SpecError(
                "model_zoo= is set but model_def= is empty: name the model function, "
                "e.g. model_def='mnist.custom_model'."
            )
        check_kubernetes_options(self)
        if self.strategy == Strategy.ALLREDUCE and self.overlap_communication:
            raise SpecError(
                "overlap_communication=True applies to the 'ps' strategy: allreduce steps "
                "are synchronous. Drop overlap_communication=True or use strategy='ps'."
            )
        if self.grads_to_wait and self.strategy != Strategy.PS:
            raise SpecError(
                "grads_to_wait= makes parameter servers wait for N gradients; the allreduce "
                "strategy is synchronous already. Drop grads_to_wait= or use strategy='ps'."
            )
        if self.grads_to_wait and self.overlap_communication:
            raise SpecError(
                "grads_to_wait= (synchronous PS) needs each gradient computed on the newest "
                "version, and overlap_communication=True computes on one update old: drop one."
            )
        if self.standby_workers and self.strategy != Strategy.PS:
            raise SpecError(
                "standby_workers= keeps workers ready to take a lost one's place in a 'ps' "
                "job; an allreduce group takes in a new member with the model handed over "
                "(it cannot wait outside the group). Drop standby_workers= or use strategy='ps'."
            )
        if self.min_workers > self.workers:
            raise SpecError(
                f"min_workers={self.min_workers} is above workers={self.workers}: a range "
                f"is MIN:MAX, e.g. workers='{self.workers}:{self.min_workers}'."
            )
        if self.scale_policy == "throughput" and not self.min_workers:
            raise SpecError(
                f"scale_policy='throughput' grows a worker range from its MIN: give one, "
                f"e.g. workers='1:{self.workers}'."
            )
        if self.scale_policy == "throughput" and self.strategy == Strategy.ALLREDUCE:
            raise SpecError(
                "scale_policy='throughput' measures PS jobs (an allreduce group re-forms "
                "with every member it adds): use strategy='ps' or drop scale_policy=."
            )
        if len(self.csv_delimiter) != 1:
            raise SpecError(f"csv_delimiter= must be one character, got {self.csv_delimiter!r}.")

    def tasks_per_epoch(self, record_counts: list[int], minibatches_per_task: int = 0) -> int:
        """The training tasks an epoch of sources of `record_counts` records is cut into
        (with `minibatches_per_task`, or this spec's): the most workers that train at
        once, since an epoch's tasks are queued when the epoch before is done."""
        span = self.minibatch_size * (minibatches_per_task or self.minibatches_per_task)
        return sum(-(-n // span) for n in record_counts)

    # ------------------------------------------------------------------ (de)serializing

    def to_json(self) -> str:
        """The options that differ from their defaults (`from_json` fills in the rest),
        so a job's master in an image older than this client runs any job that uses
        none of the options the image does not know yet (it refuses unknown names)."""
        defaults = JobSpec()
        changed = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(defaults, f.name)
        }
        return json.dumps(changed, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.from_options(**json.loads(text))

    @property
    def parameter_servers(self) -> int:
        """How many PS processes the job runs: none with the allreduce strategy."""
        return 0 if self.strategy == Strategy.ALLREDUCE else self.ps

    @property
    def worker_floor(self) -> int:
        """The fewest workers the job trains with: a range's MIN, else 1."""
        return self.min_workers or 1

    @property
    def base_workers(self) -> int:
        """How many workers run at `worker_priority_class` (the rest at the elastic one):
        a range's MIN, else all of them."""
        return self.min_workers or self.workers

    @property
    def workers_text(self) -> str:
        """The workers as the user writes them: '3', or the range '2:6'."""
        return format_workers(self.workers, self.min_workers)

    @property
    def records_per_task(self) -> int:
        return self.minibatch_size * self.minibatches_per_task


_FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "bool": bool, "str": str, "list[str]": list}[f.type]
    for f in dataclasses.fields(JobSpec)
}

_RANGE_HINTS = {
    "workers": "A job needs at least one worker to train; scale to 0 is not supported, "
    "stop the job instead.",
    "ps": "The parameter-server strategy needs at least one PS.",
}


def format_workers(workers: int, min_workers: int = 0) -> str:
    """'3', or '2:6' for a range."""
    return f"{min_workers}:{workers}" if min_workers else str(workers)


def _coerce(name: str, value: Any) -> Any:
    """Accept the natural Python forms: one path for a list, a path-like for a string."""
    if _FIELD_TYPES.get(name) is list:
        if value is None:
            return []
        if isinstance(value, str) or hasattr(value, "__fspath__"):
            return [str(value)]
        if isinstance(value, (list, tuple)) and all(
            isinstance(v, str) or hasattr(v, "__fspath__") for v in value
        ):
            return [str(v) for v in value]
        raise SpecError(
            f"Option '{name}' takes file paths or globs, got {type(value).__name__}. "
            "In-memory arrays are given to elasticdl_nb.train(data=(x, y))."
        )
    if _FIELD_TYPES.get(name) is str and value is None:
        return ""
    if _FIELD_TYPES.get(name) is str and hasattr(value, "__fspath__"):
        return str(value)
    return value


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name `word` most likely misspells, if one is close enough: the one
    did-you-mean rule, for keyword options here and flags, choices and notebook
    variables in the front ends."""
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return close[0] if close else None


def option_fields() -> list[dataclasses.Field]:
    """The options that front ends (CLI, magics) expose as flags."""
    return [f for f in dataclasses.fields(JobSpec) if f.metadata["cli"]]
