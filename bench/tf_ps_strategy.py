"""Training throughput: elasticdl-nb vs TensorFlow's own ParameterServerStrategy.

    .venv/bin/python bench/tf_ps_strategy.py            # full run
    .venv/bin/python bench/tf_ps_strategy.py --quick    # 1 run per side, half the CTR data
    .venv/bin/python bench/tf_ps_strategy.py --spe 0    # without the steps_per_execution row

Benchmark 2 of issue 3. Cases: CTR (examples/model_zoo/ctr.py) with 1 worker + 1 PS (2 runs
per side in full mode; also against TF with steps_per_execution=8, as many runs) and with
2 workers + 1 PS, and the digits MLP with 1 worker + 1 PS (1 run per side). The workloads
are those of bench/workloads.py: the same model functions, loss, optimizer, data records,
batch size and epochs on both sides. Runs
alternate ours / TF. Everything runs on 127.0.0.1 and every process gets the thread pins
of bench/harness.py (1 intra-op and 1 inter-op thread), except as stated for TF workers.

  ours  `workloads.run_job(w, workers=W, ps=1)`: an elasticdl-nb job (master, PS and
        worker processes). samples/s from the job's journal between the first 'loss'
        event (after every worker has sent one) and the last: global steps applied × batch
        / elapsed time; start-up and the final export are left out.

  TF    a real multi-process `tf.distribute.experimental.ParameterServerStrategy` cluster:
        W worker processes and 1 PS process, each a `tf.distribute.Server` (grpc) started
        by this file (`--tf-server`), and the coordinator ("chief") in a process of its own
        (`--coordinator`, a fresh one per run, printing its figures as JSON). Fresh servers
        for every run. TF workers get 2 inter-op threads: with 1 they never finish their
        first step (WHY_INTER_OP). Keras 3 cannot drive the strategy (tried at the start
        of every run; its error goes into the details), so the coordinator sets
        TF_USE_LEGACY_KERAS=1 before importing TensorFlow: `tf.keras` is then tf_keras
        2.21, and the workload's own model/loss/optimizer functions build the same
        architecture under `strategy.scope()`. Then `model.compile(optimizer, loss,
        steps_per_execution=1)` (tf_keras's default, and like ours one gradient step and
        one round of PS traffic per minibatch; each step is one closure the coordinator
        sends to a worker) and `model.fit(DatasetCreator(dataset_fn), epochs=E,
        steps_per_epoch=records // B)`. dataset_fn, run on every worker: the workload's
        arrays → batch(B, drop_remainder) → shuffle of the batch order every epoch →
        repeat → prefetch(AUTOTUNE). The coordinator hands each step to whichever worker is
        free, so an epoch is records // B steps over all workers (with 2 workers TF gives
        no exactly-once visitation per epoch; ours does). samples/s = records of epochs
        2..E / wall time from the end of epoch 1 to the end of epoch E (a callback stamps
        on_epoch_end, which tf_keras calls after joining all of the epoch's steps), so
        start-up, connecting, variable creation and the first epoch's tracing are left out.

Rows: the median of each side, ratio = ours / TF; the target is ratio >= 1.0 (issue 3: we
should not be slower than what a user would otherwise pick), and >= 1.5 for CTR with 1
worker (issue 19). `--spe N` (default 8) adds a row: CTR with 1 worker against TF with
steps_per_execution=N (N steps per closure, still one PS round trip per step; N=8 matches
ours, whose workers fetch tasks of 8 minibatches), target >= 1.0; its TF runs alternate
with that case's others (ours, TF, TF-N; then TF-N, TF, ours).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

NAME = "tf_ps_strategy"
TITLE = "Training throughput: elasticdl-nb vs tf.distribute ParameterServerStrategy"
BASELINE_LABEL = "tf.distribute ParameterServerStrategy (tf_keras fit)"
TARGET = 1.0
# Issue 19: CTR 1 worker + 1 PS at least 1.5x TF at its default (steps_per_execution=1),
# and at least level with it at steps_per_execution=8.
CTR_TARGET = 1.5
RESULT_PREFIX = "TF_PSS_RESULT "
HERE = Path(__file__).resolve()
CASES = [  # (workload key, workers, row label, runs per side in full mode); 1 PS everywhere
    ("ctr", 1, "CTR, 1 worker + 1 PS", 2),
    ("ctr", 2, "CTR, 2 workers + 1 PS", 1),
    ("digits", 1, "digits MLP, 1 worker + 1 PS", 1),
]
# Environment of the TF servers on top of the pins, per job name.
SERVER_ENV = {"worker": {"TF_NUM_INTEROP_THREADS": "2"}}
WHY_INTER_OP = (
    "With TF_NUM_INTEROP_THREADS=1 on the worker servers the first scheduled step never "
    "completes: the coordinator waits in ClusterCoordinator.join forever (seen with "
    "model.fit, with a dataset-free tf.function updating a 10000x16 PS variable, and with "
    "or without prefetch; a function updating a scalar PS variable does complete). With 2 "
    "inter-op threads on the workers it runs; the PS and the coordinator keep 1 + 1."
)


# ---------------------------------------------------------------------------- TF cluster


def wait_for_ports(addresses: list[str], timeout: float) -> None:
    """Block until every host:port accepts a TCP connection."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no TF server listening on {address}") from None
                time.sleep(0.1)


def serve(job_name: str, task_index: int, cluster: dict[str, list[str]]) -> None:
    """`--tf-server`: one worker or PS of the cluster; serves until killed."""
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job_name,
        task_index=task_index,
        protocol="grpc",
        start=True,
    )
    server.join()


def tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


class TFCluster:
    """W worker + 1 PS `tf.distribute.Server` processes on loopback, killed on exit."""

    def __init__(self, workers: int, logdir: Path):
        ports = harness.free_ports(workers + 2)
        self.spec = {
            "worker": [f"127.0.0.1:{p}" for p in ports[:workers]],
            "ps": [f"127.0.0.1:{ports[workers]}"],
            "chief": [f"127.0.0.1:{ports[workers + 1]}"],  # the coordinator's own server
        }
        self.logdir = logdir
        self.servers: dict[str, subprocess.Popen] = {}  # "ps0", "worker1", ...

    def __enter__(self) -> TFCluster:
        self.logdir.mkdir(parents=True, exist_ok=True)
        for job in ("ps", "worker"):
            for index in range(len(self.spec[job])):
                cmd = [
                    harness.PY,
                    str(HERE),
                    "--tf-server",
                    "--job-name",
                    job,
                    "--task-index",
                    str(index),
                    "--cluster",
                    json.dumps(self.spec),
                ]
                with open(self.logdir / f"{job}{index}.log", "wb") as log_file:
                    self.servers[f"{job}{index}"] = subprocess.Popen(
                        cmd,
                        env=harness.pinned_env(SERVER_ENV.get(job)),
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.servers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: nothing else in it
        for proc in self.servers.values():
            proc.wait(timeout=30)

    def exited(self) -> str:
        """Servers that exited (they never should) with their log tails, or ''."""
        return "; ".join(
            f"{name} exited {proc.returncode}: "
            + tail((self.logdir / f"{name}.log").read_text(errors="replace"))
            for name, proc in self.servers.items()
            if proc.poll() is not None
        )


# ---------------------------------------------------------------------------- coordinator


def coordinate(args: argparse.Namespace) -> None:
    """`--coordinator`: train the workload on the cluster, print the figures as JSON."""
    harness.pin_threads()
    if args.keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras from here on
    else:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
    t0 = time.perf_counter()
    import tensorflow as tf
    from workloads import workloads

    w = workloads(args.quick)[args.workload]
    x, y = w.data
    steps_per_epoch = w.records // w.batch
    epochs = args.epochs or w.epochs
    cluster = json.loads(args.cluster)
    wait_for_ports(cluster["worker"] + cluster["ps"], timeout=120)
    t_ready = time.perf_counter()

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster),
        task_type="chief",
        task_id=0,
        rpc_layer="grpc",
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = w.model()
        model.compile(
            optimizer=w.optimizer(), loss=w.loss, steps_per_execution=args.steps_per_execution
        )

    def dataset_fn(input_context: Any = None) -> tf.data.Dataset:
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(w.batch, drop_remainder=True)
        return batches.shuffle(steps_per_epoch).repeat().prefetch(tf.data.AUTOTUNE)

    if args.keras == "tf_keras":
        data = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    else:  # Keras 3 has no DatasetCreator (no keras.utils.experimental): a tf.data.Dataset
        data = dataset_fn()

    begin = cpu0 = 0.0
    ends: list[float] = []
    losses: list[float] = []

    def report() -> None:
        """At the end of the last epoch: print the figures (fit may take long to return)."""
        window = ends[-1] - ends[0]
        result = {
            "samples_per_s": (len(ends) - 1) * steps_per_epoch * w.batch / window,
            "window_s": window,
            "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
            "steps_per_execution": args.steps_per_execution,
            "first_epoch_s": ends[0] - begin,
            "ready_s": t_ready - t0,  # TF import and data here; servers listening
            "startup_s": begin - t0,  # + connecting and building the model
            "coordinator_cpu_per_wall": (time.process_time() - cpu0) / (ends[-1] - begin),
            "loss_per_epoch": [round(v, 5) for v in losses],
            "model_class": f"{type(model).__module__}.{type(model).__name__}",
            "loadavg_1m": os.getloadavg()[0],
        }
        print(RESULT_PREFIX + json.dumps(result), flush=True)

    class EpochStamps(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs: dict | None = None) -> None:
            nonlocal begin, cpu0
            begin, cpu0 = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            ends.append(time.perf_counter())
            losses.append(float((logs or {}).get("loss", float("nan"))))
            if len(ends) == epochs:
                report()

    model.fit(
        data,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        verbose=0,
        callbacks=[EpochStamps()],
    )


def error_of(stderr: str) -> str:
    """The exception line(s) ending a Python traceback, else the last lines of stderr."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    if not starts:
        return tail(stderr)[:1500]
    frames = lines[starts[-1] + 1 :]
    last_frame_line = max((i for i, line in enumerate(frames) if line.startswith(" ")), default=-1)
    return " ".join(line.strip() for line in frames[last_frame_line + 1 :])[:1500]


def read_result(proc: subprocess.Popen, timeout: float) -> dict[str, Any] | None:
    """The coordinator's RESULT_PREFIX line from its stdout, None if it exited without one.

    Raises TimeoutError if neither happens within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    fd, buffer = proc.stdout.fileno(), b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if not select.select([fd], [], [], remaining)[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if text.startswith(RESULT_PREFIX):
                return json.loads(text[len(RESULT_PREFIX) :])


def run_tf(
    workload: str,
    workers: int,
    quick: bool,
    logdir: Path,
    *,
    keras: str = "tf_keras",
    steps_per_execution: int = 1,
    epochs: int = 0,
    timeout: float = 300,
) -> dict[str, Any]:
    """One TF PSS run on fresh servers; the coordinator's figures, or RuntimeError(why).

    The coordinator and the servers are killed as soon as the figures are in.
    """
    t0 = time.perf_counter()
    with TFCluster(workers, logdir) as cluster:
        cmd = [
            harness.PY,
            str(HERE),
            "--coordinator",
            "--workload",
            workload,
            "--cluster",
            json.dumps(cluster.spec),
            "--keras",
            keras,
            "--steps-per-execution",
            str(steps_per_execution),
            "--epochs",
            str(epochs),
        ] + (["--quick"] if quick else [])
        env = harness.pinned_env()
        env.pop("TF_USE_LEGACY_KERAS", None)  # the coordinator sets it (or not) itself
        err_path = logdir / "coordinator.log"
        with open(err_path, "wb") as err_file:
            coordinator = subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err_file,
                start_new_session=True,
            )
        try:
            result = read_result(coordinator, timeout)
        except TimeoutError:
            result, timed_out = None, True
        else:
            timed_out = False
        finally:
            if coordinator.poll() is None:
                os.killpg(coordinator.pid, signal.SIGKILL)
            coordinator.wait()
            coordinator.stdout.close()
        if result is not None:
            result["wall_s"] = time.perf_counter() - t0
            return result
        err = err_path.read_text(errors="replace")
        servers = cluster.exited()
        if timed_out:
            why = f"no result after {timeout:.0f} s (coordinator killed); last log: {tail(err)}"
        else:
            why = f"coordinator exited {coordinator.returncode} without a result: {error_of(err)}"
        raise RuntimeError(why + (f"; servers: {servers}" if servers else ""))


# ---------------------------------------------------------------------------- benchmark


def keras3_check(logdir: Path) -> dict[str, Any]:
    """Keras 3 (no TF_USE_LEGACY_KERAS) on a 1-worker cluster, 2 CTR epochs: what happens."""
    attempt = (
        "Keras 3: model built and compiled under strategy.scope(), then "
        "model.fit(tf.data.Dataset, epochs=2, steps_per_epoch=...) (Keras 3 has no "
        "DatasetCreator)"
    )
    try:
        result = run_tf("ctr", 1, True, logdir, keras="keras3", epochs=2, timeout=120)
        return {"attempt": attempt, "runs": True, "result": result}
    except RuntimeError as e:
        return {"attempt": attempt, "runs": False, "error": str(e)}


def scalars(run: dict[str, Any]) -> dict[str, Any]:
    """A run's figures without the long per-task lists."""
    return {k: v for k, v in run.items() if not isinstance(v, list | dict) or k.startswith("loss")}


def benchmark(quick: bool, spe: int) -> None:
    harness.pin_threads()
    started = time.perf_counter()
    import workloads as wl  # after the pins: it imports TensorFlow

    home = tempfile.mkdtemp(prefix="edl-bench-tfpss-")
    os.environ["ELASTICDL_NB_HOME"] = home  # our jobs' directories; TF logs go here too
    ws = wl.workloads(quick)
    runs = {label: {"ours": [], "tf": [], "errors": []} for _, _, label, _ in CASES}
    details: dict[str, Any] = {}
    harness.log(f"jobs and TF logs under {home}; load average {os.getloadavg()}")

    def measure(label: str, side: str, key: str, workers: int, rep: int, **tf_args: Any) -> None:
        w = ws[key]
        try:
            if side == "ours":
                out = wl.run_job(w, workers, f"r{rep}")
            else:
                logdir = Path(home) / f"{side}-{key}-{workers}w-r{rep}"
                out = run_tf(key, workers, quick, logdir, timeout=w.timeout, **tf_args)
        except Exception as e:  # noqa: BLE001 - recorded in the row; the other runs go on
            runs[label]["errors"].append(f"{side}: {type(e).__name__}: {e}")
            harness.log(f"{label}: {side} FAILED: {e}")
            return
        runs[label].setdefault(side, []).append(scalars(out))
        harness.log(
            f"{label}: {side} {out['samples_per_s']:,.0f} samples/s (window {out['window_s']:.1f}"
            f" s, wall {out['wall_s']:.1f} s, load {out['loadavg_1m']:.1f})"
        )

    try:
        details["keras3"] = keras3_check(Path(home) / "tf-keras3")
        harness.log(f"Keras 3 driving ParameterServerStrategy: {details['keras3']}")
        for case, (key, workers, label, full_reps) in enumerate(CASES):
            # The CTR 1-worker case also runs TF with N steps per execution, in the same
            # alternation: each baseline beside the runs of ours it is compared with (on
            # this machine, speed drifts over minutes, and not alike for both sides).
            sides = ["ours", "tf"] + ([f"tf_spe{spe}"] if case == 0 and spe > 1 else [])
            for rep in range(1 if quick else full_reps):
                for side in sides if rep % 2 == 0 else sides[::-1]:
                    spe_args = {"steps_per_execution": spe} if side.startswith("tf_spe") else {}
                    measure(label, side, key, workers, rep, **spe_args)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    rows = []
    for key, _, label, _ in CASES:
        w, r = ws[key], runs[label]
        notes = [f"batch {w.batch}, {w.epochs} epochs of {w.records:,} records"]
        if r["errors"]:
            notes.append("failed runs: " + " / ".join(r["errors"]))
        rows.append(
            harness.row(
                case=label,
                metric="samples/s",
                unit="samples/s",
                ours=[x["samples_per_s"] for x in r["ours"]],
                baseline=[x["samples_per_s"] for x in r["tf"]] or None,
                baseline_label=BASELINE_LABEL,
                higher_is_better=True,
                target=CTR_TARGET if (key, label) == ("ctr", CASES[0][2]) else TARGET,
                note="; ".join(notes),
            )
        )
    details.update(
        runs=runs,
        tf_configuration={
            "keras": "tf_keras 2.21 (TF_USE_LEGACY_KERAS=1 in the coordinator process)",
            "compile": "optimizer, loss, steps_per_execution=1 (tf_keras's default too)",
            "fit": "DatasetCreator(dataset_fn), epochs=E, steps_per_epoch=records // B",
            "dataset_fn": "from_tensor_slices(arrays).batch(B, drop_remainder=True)"
            ".shuffle(batches per epoch).repeat().prefetch(AUTOTUNE)",
            "variable_partitioner": None,
            "server_env_on_top_of_pins": SERVER_ENV,
            "why_worker_inter_op_2": WHY_INTER_OP,
        },
    )
    if spe > 1:  # ours against TF with N steps per execution: a row of its own
        label = CASES[0][2]
        rows.insert(
            1,
            harness.row(
                case=f"{label} (TF: steps_per_execution={spe})",
                metric="samples/s",
                unit="samples/s",
                ours=[x["samples_per_s"] for x in runs[label]["ours"]],
                baseline=[x["samples_per_s"] for x in runs[label].get(f"tf_spe{spe}", [])] or None,
                baseline_label=f"{BASELINE_LABEL}, steps_per_execution={spe}",
                target=TARGET,
                note="TF runs N steps per dispatch from its coordinator, still one PS round trip "
                "per step; ours fetches tasks of 8 minibatches",
            ),
        )
    seconds = time.perf_counter() - started
    command = f".venv/bin/python bench/{NAME}.py" + (" --quick" if quick else "")
    command += f" --spe {spe}" if spe > 1 else ""
    harness.write_result(NAME, TITLE, rows, details, command=command, seconds=seconds)
    harness.log(f"done in {seconds:.0f} s")


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run per side, less CTR data")
    parser.add_argument(
        "--spe",
        type=int,
        default=8,
        metavar="N",
        help="also the CTR 1-worker case against TF with steps_per_execution=N (0: skip)",
    )
    internal = parser.add_argument_group("internal (the TF processes this script starts)")
    internal.add_argument("--tf-server", action="store_true")
    internal.add_argument("--coordinator", action="store_true")
    internal.add_argument("--job-name")
    internal.add_argument("--task-index", type=int, default=0)
    internal.add_argument("--cluster")
    internal.add_argument("--workload")
    internal.add_argument("--keras", default="tf_keras", choices=["tf_keras", "keras3"])
    internal.add_argument("--steps-per-execution", type=int, default=1)
    internal.add_argument("--epochs", type=int, default=0, help="0: the workload's")
    args = parser.parse_args()
    if args.tf_server:
        serve(args.job_name, args.task_index, json.loads(args.cluster))
    elif args.coordinator:
        coordinate(args)
    else:
        benchmark(args.quick, args.spe)


if __name__ == "__main__":
    main()
