"""The benchmark workloads (model, loss, optimizer, data, batch) and how each side runs them.

Every comparison of training speed uses these, so both sides always get the same model
functions, data, optimizer, epochs and batch size:

- `digits`: 64 → Dense 64 relu → Dense 10, Adam(1e-3), scikit-learn's bundled digits.
- `ctr`: examples/model_zoo/ctr.py (4 × Embedding(10000, 16) → 64 → 32 → 1, Adagrad(0.1))
  on `make_ctr_data` (generated with known true logits).
- `cnn`: a small CNN on the digits as 8×8×1 images (Conv 16 → pool → Conv 32 → Dense 10,
  Adam(1e-3)).

Record counts are multiples of batch × minibatches_per_task, so every minibatch of a job is
full and steps × batch is the exact record count.

`run_fit` measures single-process `model.fit` in this process (with all cores' worth of
intra-op threads); `run_job` an elasticdl-nb job (`edl.train`) whose processes inherit one
thread each, measured from its journal (see each function). Import this module after
`harness.pin_threads()`, so TensorFlow starts with the pins.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tensorflow as tf
from harness import BASELINE_THREADS, ROOT

import elasticdl_nb as edl

# The single-process baseline runs in this process and gets the whole machine (intra- and
# inter-op pools as TensorFlow sizes them on its own); the environment, inherited by our
# jobs' processes, keeps the one-thread pins.
tf.config.threading.set_intra_op_parallelism_threads(BASELINE_THREADS)
tf.config.threading.set_inter_op_parallelism_threads(BASELINE_THREADS)


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    model: Callable[[], tf.keras.Model]
    loss: Callable
    optimizer: Callable[[], tf.keras.optimizers.Optimizer]
    data: tuple[np.ndarray, np.ndarray]
    batch: int
    per_task: int  # minibatches per task of our jobs
    epochs: int
    timeout: float  # seconds a job may take before the benchmark gives up on it

    @property
    def records(self) -> int:
        return len(self.data[0])

    def with_tasks_for(self, workers: int) -> Workload:
        """This workload with minibatches per task cut down, if need be, so that an epoch
        has at least `workers` tasks. The master queues an epoch's tasks when the one
        before is done, so workers beyond its task count wait out every epoch: the CNN's
        1,408 digits in tasks of 11 minibatches are 2 tasks, so three workers trained
        two thirds of the time each and a fourth added nothing."""
        minibatches = self.records // self.batch
        per_task = max(
            (
                n
                for n in range(1, self.per_task + 1)
                if minibatches % n == 0 and minibatches // n >= workers
            ),
            default=1,
        )
        return replace(self, per_task=per_task)

    def train(self, **options: Any) -> edl.Job:
        """An elasticdl-nb job of this workload: its functions, data, batch and task
        size, and data and epochs unless `options` say otherwise (data: the arrays
        staged as files, for a job whose ConfigMap cannot hold them)."""
        return edl.train(
            self.model,
            loss=self.loss,
            optimizer=self.optimizer,
            minibatch_size=self.batch,
            minibatches_per_task=self.per_task,
            **{"data": self.data, "epochs": self.epochs, **options},
        )


# ---------------------------------------------------------------------------- models


def digits_mlp() -> tf.keras.Model:
    inputs = tf.keras.Input(shape=(64,), name="pixels")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inputs)
    logits = tf.keras.layers.Dense(10, name="logits")(hidden)
    return tf.keras.Model(inputs, logits, name="digits_mlp")


def digits_cnn() -> tf.keras.Model:
    inputs = tf.keras.Input(shape=(64,), name="pixels")
    image = tf.keras.layers.Reshape((8, 8, 1))(inputs)
    x = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu")(image)
    x = tf.keras.layers.MaxPooling2D()(x)
    x = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = tf.keras.layers.Flatten()(x)
    logits = tf.keras.layers.Dense(10, name="logits")(x)
    return tf.keras.Model(inputs, logits, name="digits_cnn")


def digits_loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def adam() -> tf.keras.optimizers.Optimizer:
    return tf.keras.optimizers.Adam(learning_rate=0.001)


def ctr_module():
    """examples/model_zoo/ctr.py, loaded from its file (examples/ is not a package here)."""
    spec = importlib.util.spec_from_file_location("ctr", ROOT / "examples/model_zoo/ctr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digits_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n digits of a seeded shuffle, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    return np.ascontiguousarray(x[order][:n]), np.ascontiguousarray(y[order][:n])


def workloads(quick: bool = False) -> dict[str, Workload]:
    """The three workloads; `quick` trims epochs/records for a fast look."""
    ctr = ctr_module()
    ctr_n = 102_400 if quick else 204_800
    ids, clicks, _ = ctr.make_ctr_data(ctr_n)
    digits = digits_data(1408)  # 22 × 64
    out = {
        "digits": Workload(
            "digits",
            "digits MLP (64-64-10, Adam)",
            digits_mlp,
            digits_loss,
            adam,
            digits,
            batch=64,
            per_task=11,
            epochs=40 if quick else 80,
            timeout=240,
        ),
        "ctr": Workload(
            "ctr",
            "CTR (4×Embedding(10000,16)-64-32-1, Adagrad)",
            ctr.custom_model,
            ctr.loss,
            ctr.optimizer,
            (ids, clicks),
            batch=256,
            per_task=8,
            epochs=3,
            timeout=300,
        ),
        "cnn": Workload(
            "cnn",
            "small CNN (8×8 digits, conv16-conv32-10, Adam)",
            digits_cnn,
            digits_loss,
            adam,
            digits,
            batch=64,
            per_task=11,
            epochs=15 if quick else 30,
            timeout=240,
        ),
    }
    for w in out.values():
        assert w.records % (w.batch * w.per_task) == 0, (w.key, w.records)
    return out


# ---------------------------------------------------------------------------- baseline


class _EpochStamps(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begin = 0.0
        self.ends: list[float] = []

    def on_train_begin(self, logs=None):
        self.begin = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())


class _BatchWindow(tf.keras.callbacks.Callback):
    """Times the batches after the first `skip` (tracing) and stops training once they
    span `seconds`."""

    def __init__(self, skip: int, seconds: float):
        super().__init__()
        self.skip, self.seconds = skip, seconds
        self.batches, self.start, self.end = 0, 0.0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        now = time.perf_counter()
        if self.batches == self.skip:
            self.start = now
        elif self.batches > self.skip:
            self.end = now
            if now - self.start >= self.seconds:
                self.model.stop_training = True


def run_fit(w: Workload, seconds: float | None = None) -> dict[str, Any]:
    """Plain Keras in this process: compile(optimizer, loss) + fit(x, y, batch_size=B).

    Keras defaults otherwise (jit_compile='auto' is False on this CPU-only machine,
    steps_per_execution=1, shuffle=True). samples/s = records of epochs 2..E / wall time
    from the end of epoch 1 to the end of epoch E: the first epoch's tracing is excluded,
    the gaps between epochs are included.

    `seconds`: for a model whose epochs are too slow to run whole on a slow machine,
    samples/s over a window of that many seconds of batches instead, after the first
    10 (tracing); training stops there.
    """
    tf.keras.backend.clear_session()
    model = w.model()
    model.compile(optimizer=w.optimizer(), loss=w.loss)
    stamps = _EpochStamps()
    window_stamps = _BatchWindow(10, seconds) if seconds else None
    callbacks = [stamps] + ([window_stamps] if window_stamps else [])
    x, y = w.data
    cpu0, t0 = time.process_time(), time.perf_counter()
    model.fit(x, y, batch_size=w.batch, epochs=w.epochs, verbose=0, callbacks=callbacks)
    total = time.perf_counter() - t0
    if window_stamps:
        window = window_stamps.end - window_stamps.start
        records = (window_stamps.batches - window_stamps.skip) * w.batch
    else:
        window = stamps.ends[-1] - stamps.ends[0]
        records = (len(stamps.ends) - 1) * w.records
    return {
        "samples_per_s": records / window,
        "window_s": window,
        "first_epoch_s": stamps.ends[0] - stamps.begin if stamps.ends else None,
        "cpu_per_wall": (time.process_time() - cpu0) / total,  # cores used (2 at most)
        "loadavg_1m": os.getloadavg()[0],
    }


# ---------------------------------------------------------------------------- ours


def steady_state(events: list, workers: int, batch: int) -> dict[str, Any]:
    """Samples/s of a finished job from its journal, start-up and export left out.

    F = the first 'loss' event after every worker has sent one, L = the last; each
    'loss' event's last point carries the master's global step (minibatches applied so
    far): samples/s = (step(L) - step(F)) × batch / (time(L) - time(F)).
    """
    if any(e.kind == "group" for e in events):
        return _steady_state_allreduce(events, batch)
    losses = [e for e in events if e.kind == "loss"]
    if len(losses) < 2:
        raise RuntimeError(f"only {len(losses)} 'loss' events: the job was too short to measure")
    seen: set = set()
    start = 0
    for i, e in enumerate(losses):
        seen.add(e.data.get("worker", 0))
        if len(seen) >= workers:
            start = i
            break
    first, last = losses[start], losses[-1]
    step0, step1 = first.data["points"][-1][0], last.data["points"][-1][0]
    states = [e for e in events if e.kind == "job_state"]
    return {
        "samples_per_s": (step1 - step0) * batch / (last.time - first.time),
        "window_s": last.time - first.time,
        "steps_in_window": step1 - step0,
        "startup_s": losses[0].time - states[0].time,  # 'running' -> first loss event
        "job_s": states[-1].time - states[0].time,
    }


def _steady_state_allreduce(events: list, batch: int) -> dict[str, Any]:
    """`steady_state` of an allreduce job, whose 'loss' events come one per step of the
    group (not per minibatch): from the 'progress' events (one per finished task, with
    the master's count of minibatches applied), F = the first after the group's first
    step, L = the last."""
    formed = next(e.time for e in events if e.kind == "group_settled")
    progress = [e for e in events if e.kind == "progress" and e.time > formed]
    if len(progress) < 2:
        raise RuntimeError(f"{len(progress)} 'progress' events: the job was too short")
    first, last = progress[0], progress[-1]
    states = [e for e in events if e.kind == "job_state"]
    steps = last.data["step"] - first.data["step"]
    return {
        "samples_per_s": steps * batch / (last.time - first.time),
        "window_s": last.time - first.time,
        "steps_in_window": steps,
        "startup_s": formed - states[0].time,  # 'running' -> the group's first step
        "job_s": states[-1].time - states[0].time,
    }


def run_job(w: Workload, workers: int, tag: str, ps: int = 1, **options: Any) -> dict[str, Any]:
    """An elasticdl-nb job with the workload's functions; measured by `steady_state`."""
    shape = "allreduce" if options.get("strategy") == "allreduce" else f"{ps}ps"
    name = f"bench-{w.key}-{workers}w{shape}-{tag}"
    t0 = time.perf_counter()
    job = w.train(
        workers=workers,
        ps=ps,
        name=name,
        **options,
    )
    try:
        status = job.wait(timeout=w.timeout, progress=False)
    except TimeoutError:
        job.stop()
        raise
    if status.get("state") != "succeeded":
        raise RuntimeError(f"job {name} ended {status.get('state')}: {status.get('error')}")
    events = list(job.events(follow=False))
    out = steady_state(events, workers, w.batch)
    timings = [e.data for e in events if e.kind == "worker_time"]
    task_s = sum(t["task_s"] for t in timings)
    out.update(
        job=name,
        wall_s=time.perf_counter() - t0,
        loadavg_1m=os.getloadavg()[0],
        # Of the workers' time on training tasks, the share spent blocked on PS replies
        # (allreduce: in the allreduce).
        communication_share=sum(t["wait_s"] for t in timings) / task_s if task_s else None,
        compute_share=sum(t["compute_s"] for t in timings) / task_s if task_s else None,
    )
    return out
