"""The model's callbacks (its `callbacks()`, and `callbacks=[...]` given to the SDK),
called in the master, where they can act on the whole job.

Keras calls a callback's hooks from `fit`; here the master calls them at the same points
of the job: `on_train_begin` before the first epoch, `on_epoch_begin(epoch)` before an
epoch's tasks are handed out, `on_epoch_end(epoch, logs)` once the epoch's training is
applied and its evaluation (if any) is in (`logs`: the epoch's mean training `loss` and
the evaluation's metrics as `val_<name>`, as in Keras), `on_test_end(logs)` after each
evaluation round, `on_train_batch_end(step, logs)` as training tasks end (`step`: the
minibatches applied so far), `on_train_end(logs)` when the job has trained.

A callback acts on the job through what it sees as `self.model`: `stop_training = True`
ends training (the job still evaluates, exports and succeeds, its reason naming the
callback), and `optimizer.learning_rate = x` sets the learning rate of every update from
then on (on the parameter servers, or on every replica). Anything else of the model is
not in the master, and a callback that reaches for it fails the job saying so.

Calls are made on the calling thread (the coordinator or the evaluator, never an RPC
thread), one at a time; the master applies what they decided (`Decisions`) under its
lock. Loading the callbacks imports TensorFlow: it starts on a thread of its own when
the master starts, and the first epoch waits for it.

Every call but `on_train_batch_end` (made as tasks end: too many, and ElasticDL's
`MaxStepsStopping` keeps no state) is journaled (`callback` events). A master that takes
a job over calls them again, in order, on its freshly loaded callbacks, so that their
state (an `EarlyStopping`'s best value and patience) is what it was; what they decided
then is not decided again (the journal kept it).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("elasticdl_nb.master")

# What a callback may change on the job from `self.model`.
ACTIONS = "stop_training and optimizer.learning_rate"


class CallbackError(RuntimeError):
    """A callback failed or used what a job's master does not have."""


class NotInTheMaster(CallbackError, AttributeError):
    """A callback reached for a part of the model the master does not have (an
    AttributeError too, so that `hasattr` answers False)."""


@dataclass
class Decisions:
    """What callbacks decided in one round of calls."""

    stop: str = ""  # why training stops ("" = it goes on)
    learning_rate: float | None = None  # set by a callback
    set_by: str = ""  # the callback that set it


class _Optimizer:
    """`self.model.optimizer` of a callback in the master: its learning rate only."""

    def __init__(self, model: JobModel):
        self._model = model

    @property
    def learning_rate(self) -> float:
        return self._model.learning_rate

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        rate = float(getattr(value, "numpy", lambda: value)())
        if not rate > 0:
            raise CallbackError(f"a callback set the learning rate to {rate}: it must be > 0")
        self._model.learning_rate = rate
        self._model.rate_changed = True

    # Keras 2 spelling (ElasticDL's and older callbacks: K.set_value(optimizer.lr, x)).
    lr = learning_rate

    def __getattr__(self, name: str):
        raise NotInTheMaster(_missing(f"model.optimizer.{name}"))


class JobModel:
    """What a callback sees as `self.model` in the master."""

    def __init__(self, learning_rate: float):
        self.stop_training = False
        self.learning_rate = learning_rate
        self.rate_changed = False
        self.optimizer = _Optimizer(self)

    def __getattr__(self, name: str):
        raise NotInTheMaster(_missing(f"model.{name}"))


def _where(hook: str, args: tuple) -> str:
    if hook.startswith("on_epoch"):
        return f"at the end of epoch {args[0]}" if hook.endswith("end") else f"at epoch {args[0]}"
    return f"at step {args[0]}" if args else f"in {hook}"


def _missing(what: str) -> str:
    return (
        f"a callback used {what}, which a distributed job's master does not have: callbacks "
        f"in a job act on it through {ACTIONS}. Run other callbacks in the notebook, on "
        "the model that job.model() returns."
    )


class JobCallbacks:
    """The job's callbacks and the master's calls to them."""

    def __init__(
        self,
        load: Callable[[], tuple[list, float]],
        record: Callable[[str, list, dict], None] | None = None,
    ):
        """`load()` returns (the callbacks, the optimizer's initial learning rate, or 0
        when it is a schedule); `record(hook, args, logs)` journals a call."""
        self._load, self._record = load, record
        self._lock = threading.Lock()
        self.callbacks: list = []
        self.model: JobModel | None = None
        self.error: Exception | None = None
        self.loaded = threading.Event()
        self._began = False
        self._loss_sum, self._loss_count = 0.0, 0
        self._epoch_loss: dict[int, float] = {}  # an epoch's mean, until its end is called
        self._replay: list[tuple[str, list, dict]] = []  # calls an earlier master made
        self._decided_before: tuple[bool, float] = (False, 0.0)

    def replay(self, calls: list[tuple[str, list, dict]], stopped: bool, rate: float) -> None:
        """Before `start`: the calls an earlier master of the job made (its `callback`
        events), and what the callbacks had decided (training stopped, the rate set)."""
        self._replay, self._decided_before = list(calls), (stopped, rate)

    def start(self) -> None:
        """Load the callbacks (on a thread of their own)."""
        threading.Thread(target=self._load_now, daemon=True, name="callbacks").start()

    def _load_now(self) -> None:
        try:
            callbacks, rate = self._load()
            self.model = JobModel(rate)
            for callback in callbacks:
                callback.set_model(self.model)
            self.callbacks = list(callbacks)
            self._call_again()
        except Exception as exc:  # (the master fails the job with it at the first call)
            log.exception("loading the callbacks")
            self.error = exc
        self.loaded.set()

    def _call_again(self) -> None:
        """Rebuild the callbacks' state from an earlier master's calls."""
        if not self._replay:
            return
        for hook, args, logs in self._replay:
            self._each(hook, args, dict(logs), Decisions())  # (decided then: in the journal)
        self._began = True
        stopped, rate = self._decided_before
        self.model.stop_training = stopped
        if rate:
            self.model.learning_rate = rate
        self.model.rate_changed = False
        log.info("callbacks: %d calls of the master before called again", len(self._replay))

    def of_type(self, name: str) -> list:
        return [c for c in self.callbacks if type(c).__name__ == name]

    # ------------------------------------------------------------------ the hooks

    def losses(self, values: list[float]) -> None:
        """Training losses reported (for the epoch's mean `loss` in its end logs)."""
        with self._lock:
            self._loss_sum += sum(values)
            self._loss_count += len(values)

    def epoch_trained(self, epoch: int) -> None:
        """Every minibatch of `epoch` is applied: its losses are all in (its end may be
        called later, once its evaluation is: the next epoch trains meanwhile)."""
        with self._lock:
            if self._loss_count:
                self._epoch_loss[epoch] = self._loss_sum / self._loss_count
            self._loss_sum, self._loss_count = 0.0, 0

    def epoch_begin(self, epoch: int) -> Decisions:
        return self._call("on_epoch_begin", {}, epoch)

    def epoch_end(self, epoch: int, metrics: dict | None) -> Decisions:
        with self._lock:
            loss = self._epoch_loss.pop(epoch, None)
        logs = {} if loss is None else {"loss": loss}
        logs.update({f"val_{name}": value for name, value in (metrics or {}).items()})
        return self._call("on_epoch_end", logs, epoch)

    def test_end(self, metrics: dict) -> Decisions:
        return self._call("on_test_end", dict(metrics))

    def steps_done(self, step: int) -> Decisions:
        return self._call("on_train_batch_end", {"step": step}, step)

    def train_end(self, metrics: dict) -> Decisions:
        return self._call("on_train_end", dict(metrics))

    def _call(self, hook: str, logs: dict, *args) -> Decisions:
        """Call `hook` of every callback; what they decided. Raises CallbackError."""
        self.loaded.wait()  # (a master that took a job over calls before they are loaded)
        if self.error is not None:
            raise CallbackError(f"the callbacks could not be loaded: {self.error!r}")
        decided = Decisions()
        with self._lock:
            if not self._began:
                self._began = True
                self._journal("on_train_begin", [], {})
                self._each("on_train_begin", (), {}, decided)
            if hook != "on_train_batch_end":
                self._journal(hook, list(args), logs)
            self._each(hook, args, logs, decided)
        return decided

    def _each(self, hook: str, args, logs: dict, decided: Decisions) -> None:
        """Call `hook` of every callback, noting in `decided` what they decided."""
        model = self.model
        for callback in self.callbacks:
            name = type(callback).__name__
            was_stopping = model.stop_training
            try:
                getattr(callback, hook)(*args, logs=logs)
            except CallbackError as exc:
                raise CallbackError(f"{name}.{hook}: {exc}") from None
            except Exception as exc:
                raise CallbackError(f"{name}.{hook} raised {exc!r}") from exc
            if model.stop_training and not was_stopping:
                decided.stop = f"stopped early by {name} {_where(hook, args)}"
            if model.rate_changed:
                model.rate_changed = False
                decided.learning_rate, decided.set_by = model.learning_rate, name

    def _journal(self, hook: str, args: list, logs: dict) -> None:
        if self._record is not None and self.callbacks:
            self._record(hook, args, logs)


CALLBACKS_FILE = "callbacks.json"  # in the bundle: the callbacks' names, by the preflight


def callbacks_for(
    bundle: Path,
    load_contract: Callable[[], object],
    record: Callable[[str, list, dict], None] | None = None,
) -> JobCallbacks | None:
    """The job's callbacks (not loaded yet: `start`), or None when it has none. The
    one-minibatch check wrote their names into the bundle; without that file (no check),
    loading them says."""
    listed = Path(bundle) / CALLBACKS_FILE
    if listed.exists() and not json.loads(listed.read_text()):
        return None

    def load() -> tuple[list, float]:
        contract = load_contract()
        callbacks = list(contract.callbacks()) if contract.callbacks else []
        return callbacks, initial_learning_rate(contract.optimizer())

    return JobCallbacks(load, record)


def initial_learning_rate(optimizer) -> float:
    """The optimizer's learning rate as a number (0 when it is a schedule)."""
    from elasticdl_nb.keras_flavor import keras

    rate = optimizer.learning_rate if hasattr(optimizer, "learning_rate") else 0.0
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        return 0.0
    return float(np.asarray(rate))


# Keras callbacks that need what only a process holding the model has.
_NEEDS_THE_MODEL = {
    "ModelCheckpoint": "the job checkpoints itself (checkpoint_steps) and exports the model "
    "at its end",
    "BackupAndRestore": "the job checkpoints itself and survives failures without it",
    "TensorBoard": "the job writes TensorBoard files itself, under its directory's "
    "tensorboard/ (option tensorboard)",
}
_SET_THE_RATE = {"LearningRateScheduler", "ReduceLROnPlateau"}


def check_callbacks(callbacks: list, optimizer) -> list[str]:
    """Refuse, before launch, callbacks a job cannot call in its master; returns their
    class names. Raises ValueError with the fix."""
    from elasticdl_nb.callbacks import LearningRateScheduler as VersionSchedule
    from elasticdl_nb.keras_flavor import keras

    names = []
    schedule = initial_learning_rate(optimizer) == 0.0
    for callback in callbacks:
        name = type(callback).__name__
        if not isinstance(callback, keras.callbacks.Callback):
            raise ValueError(
                f"callbacks() returned a {name}, not a keras.callbacks.Callback: return a "
                "list of Keras callbacks (or elasticdl_nb.callbacks ones)."
            )
        if name in _NEEDS_THE_MODEL:
            raise ValueError(
                f"{name} needs the model's weights in the process that calls it, and a job "
                f"calls callbacks in its master: drop it ({_NEEDS_THE_MODEL[name]})."
            )
        if getattr(callback, "restore_best_weights", False):
            raise ValueError(
                f"{name}(restore_best_weights=True) needs the model's weights in the process "
                "that calls it, and a job calls callbacks in its master: drop "
                "restore_best_weights (the job exports the model as it is when training stops)."
            )
        sets_rate = name in _SET_THE_RATE or isinstance(callback, VersionSchedule)
        if sets_rate and schedule:
            raise ValueError(
                f"{name} sets the learning rate, and the optimizer's learning rate is a "
                "schedule: use one or the other."
            )
        names.append(name)
    setters = [
        n for n, c in zip(names, callbacks) if n in _SET_THE_RATE or isinstance(c, VersionSchedule)
    ]
    if len(setters) > 1 and any(isinstance(c, VersionSchedule) for c in callbacks):
        raise ValueError(
            f"{' and '.join(setters)} both set the learning rate, and ElasticDL's "
            "LearningRateScheduler sets the rate of every update: keep one of them."
        )
    return names
