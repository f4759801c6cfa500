"""Benchmark (issue 17): embedding tables that live on the parameter servers only.

    .venv/bin/python bench/embeddings.py [--quick]

A. Throughput and memory, side by side in one run, alternating (ours, full-table, fit,
   twice): a CTR model with one 10M-row × 16 table (4 fields, each looking up its quarter
   of the ids, Zipf-like popularity) → 64 → 32 → 1, Adagrad(0.1), 1 worker + 2 PS.
   - ours: this tree: the table lives on the 2 PS, a worker holds the rows of the
     minibatches in flight.
   - full-size worker tables: the same job on the code before issue 17
     (`FULL_TABLE_COMMIT`, exported once to ~/.cache/elasticdl-nb/bench-trees/ and put
     first on the PYTHONPATH of the process that runs the job, so the job runs that code):
     every worker builds the whole table and the PS keep whole shards.
   - Keras `fit`, one process, on the same model (the table fits: 640 MB).
   Each side trains for at most `MEASURE_SECONDS` (a job after its start-up; one that
   has not ended by then is stopped). Samples/s from each job's journal
   (bench/workloads.py `steady_state`); fit's from a window of its batches after the
   first ten (`run_fit(seconds=)`). Ratios: ours / full-table (target >= 0.9),
   ours / fit (reported). Peak RSS (VmHWM) of the worker and of the larger PS of each
   job, and of the fit process.
   Each measurement runs in a child process of its own (a fresh TensorFlow).
B. Bounded PS memory: one table of `elasticdl_nb.layers.Embedding(16, max_rows=5M)`, ids
   drawn uniformly from a 1e9 range (~10M distinct, so the cap is hit and rows churn),
   1 worker + 2 PS, trained for 10 minutes (--quick: 2). Every 5 s: the rows each PS
   holds (its `tables` events) and each PS's RSS; plotted to bench/plots/embedding_memory.png.
   Judged: the PS's RSS (the sum over both) does not grow once the cap is reached: its
   median over the last quarter of the run against its median over the second quarter
   (limit: 10 % growth). The peak is reported beside it: checkpoints copy rows for a
   moment (a whole-table snapshot every tenth).
C. Checkpoint cost, in one process with the PS's own store and checkpoint directory: a
   table of 4M rows × 16 (Adagrad: one slot), saved whole, then 1M of its rows updated and
   saved as a delta. Seconds per million rows for each (the snapshot under the store's
   lock, which stalls training, and the whole save); the ratio is whole / delta per
   checkpoint (how much the delta saves).

`--parts B,C` runs only those parts and keeps the other parts' figures from the last
result (each part carries the date it was measured).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import harness
import numpy as np

FULL_TABLE_COMMIT = "bfe1b89"  # main before issue 17: whole tables in every worker
TABLE_ROWS = 10_000_000
FIELDS = 4
HASH_RANGE = 10**9
BOUNDED_MAX_ROWS = 5_000_000
# Workload A's sides train for at most this long (after a job's start-up): on a machine
# with slow memory the two baselines (a whole 10M-row table stepped by each worker, and
# fit's dense Adagrad update of it) ran at a tenth of their usual speed and would have
# taken hours at a fixed number of records; a rate needs only a steady window.
MEASURE_SECONDS = 120.0
JOB_STARTUP_SECONDS = 60.0


# ---------------------------------------------------------------------------- memory


def _job_processes(home: Path) -> dict[int, str]:
    """pid -> 'worker' or 'ps' for the live workers and PS of jobs under `home`."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if "elasticdl_nb.runtime." not in cmdline:
            continue
        if str(home) in cmdline or f"ELASTICDL_NB_JOB_DIR={home}".encode() in environ:
            for role in ("worker", "ps"):
                if f"elasticdl_nb.runtime.{role} " in cmdline + " ":
                    found[int(proc.name)] = role
    return found


def _status_kib(pid: int | str, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakWatcher:
    """Samples the peak RSS (VmHWM) of a home's job processes: while the job trains (its
    phase: the export after it builds the whole model, which is measured apart), and to
    the end."""

    def __init__(self, home: Path, job):
        self.home, self.job = home, job
        self.training: dict[int, tuple[str, int]] = {}
        self.overall: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        training = True
        while not self._stop.wait(0.2):
            if training:
                training = self.job.status().get("phase") in (None, "training")
            for pid, role in _job_processes(self.home).items():
                peak = _status_kib(pid, "VmHWM")
                if peak is not None:
                    self.overall[pid] = (role, peak)
                    if training:
                        self.training[pid] = (role, peak)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()

        def peak(peaks: dict, role: str) -> float:
            return max((p for r, p in peaks.values() if r == role), default=0) / 1024

        return {
            "worker_peak_mib": peak(self.training, "worker"),
            "ps_peak_mib": peak(self.training, "ps"),
            "worker_peak_with_export_mib": peak(self.overall, "worker"),
            "ps_peak_with_export_mib": peak(self.overall, "ps"),
        }


# ---------------------------------------------------------------------------- sides


def _ctr_10m():
    """(model function, loss, optimizer, data) of workload A."""
    import tensorflow as tf
    import workloads

    ctr = workloads.ctr_module()

    def custom_model():
        ids = tf.keras.Input(shape=(FIELDS,), dtype="int64", name="ids")
        table = tf.keras.layers.Embedding(TABLE_ROWS, 16, name="ids_table")
        x = tf.keras.layers.Flatten()(table(ids))
        x = tf.keras.layers.Dense(64, activation="relu")(x)
        x = tf.keras.layers.Dense(32, activation="relu")(x)
        return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="logit")(x))

    return custom_model, ctr


def _data(records: int):
    import workloads

    ctr = workloads.ctr_module()
    ids, clicks, _ = ctr.make_ctr_data(records, vocab=TABLE_ROWS // FIELDS, seed=1)
    ids = ids.astype("int64") + (TABLE_ROWS // FIELDS) * np.arange(FIELDS)
    return ids, clicks


def side_job(records: int, epochs: int, seconds: float) -> dict:
    """Workload A as a job of whatever elasticdl_nb this process imports, stopped after
    `seconds` of training if it has not ended by then."""
    import workloads

    import elasticdl_nb as edl

    model, ctr = _ctr_10m()
    x, y = _data(records)
    with harness.job_home() as home:
        t0 = time.perf_counter()
        job = edl.train(
            model,
            loss=ctr.loss,
            optimizer=ctr.optimizer,
            data=(x, y),
            workers=1,
            ps=2,
            epochs=epochs,
            minibatch_size=256,
            minibatches_per_task=16,
            name="bench-embeddings",
        )
        watcher = PeakWatcher(home, job)
        try:
            status = job.wait(timeout=JOB_STARTUP_SECONDS + seconds, progress=False)
        except TimeoutError:
            status = job.stop()
        peaks = watcher.stop()
        if status.get("state") not in ("succeeded", "stopped"):
            raise RuntimeError(f"job ended {status.get('state')}: {status.get('error')}")
        events = list(job.events(follow=False))
        out = workloads.steady_state(events, 1, 256)
    return {
        **out,
        **peaks,
        "wall_s": time.perf_counter() - t0,
        "code": edl.__file__,
        "stopped": status.get("state") == "stopped",
    }


def side_fit(records: int, epochs: int, seconds: float) -> dict:
    import workloads

    model, ctr = _ctr_10m()
    w = workloads.Workload(
        "ctr10m", "CTR 10M", model, ctr.loss, ctr.optimizer, _data(records), 256, 16, epochs, 1800
    )
    out = workloads.run_fit(w, seconds=seconds)
    return {**out, "process_peak_mib": _status_kib("self", "VmHWM") / 1024}


# ---------------------------------------------------------------------------- bounded


def bounded(minutes: float) -> dict:
    """Workload B: returns the samples (time, rows per PS, RSS per PS)."""
    import elasticdl_nb as edl

    rng = np.random.default_rng(9)
    records = 2_500_000
    x = rng.integers(0, HASH_RANGE, size=(records, FIELDS), dtype=np.int64)
    y = (rng.random(records) < 0.3).astype(np.float32)

    def custom_model():
        import keras

        from elasticdl_nb.layers import Embedding

        ids = keras.Input(shape=(FIELDS,), dtype="int64")
        x = keras.layers.Flatten()(Embedding(16, max_rows=BOUNDED_MAX_ROWS, name="ids")(ids))
        x = keras.layers.Dense(32, activation="relu")(x)
        return keras.Model(ids, keras.layers.Dense(1)(x))

    def loss(labels, predictions):
        import tensorflow as tf

        labels = tf.reshape(labels, [-1, 1])
        return tf.reduce_mean(
            tf.keras.losses.binary_crossentropy(labels, predictions, from_logits=True)
        )

    def optimizer():
        import keras

        return keras.optimizers.Adagrad(0.1)

    samples = []
    with harness.job_home() as home:
        job = edl.train(
            custom_model,
            loss=loss,
            optimizer=optimizer,
            data=(x, y),
            workers=1,
            ps=2,
            epochs=100,
            minibatch_size=512,
            checkpoint_steps=2000,
            name="bench-bounded",
        )
        t0, rows = time.time(), [0, 0]
        seen = 0
        while time.time() - t0 < minutes * 60:
            time.sleep(5)
            events = list(job.events(follow=False))
            for event in events[seen:]:
                if event.kind == "tables":
                    rows = event.data["ps_rows"]
            seen = len(events)
            ps = sorted(pid for pid, role in _job_processes(home).items() if role == "ps")
            rss = [(_status_kib(pid, "VmRSS") or 0) / 1024 for pid in ps]
            status = job.status()
            samples.append(
                {
                    "t": time.time() - t0,
                    "rows": list(rows),
                    "rss_mib": rss,
                    "step": status.get("step", 0),
                }
            )
            harness.log(f"  {samples[-1]['t']:.0f} s: PS rows {rows}, RSS {rss} MiB")
        job.stop()
    return {"samples": samples, "max_rows": BOUNDED_MAX_ROWS}


# ---------------------------------------------------------------------------- checkpoints


def checkpoint_cost(rows: int, changed: int) -> dict:
    """Workload C: a whole save of `rows` rows, then a delta of `changed` of them."""
    import tempfile

    import keras

    from elasticdl_nb.runtime.ps.checkpoints import CheckpointDir
    from elasticdl_nb.runtime.ps.store import ParameterStore
    from elasticdl_nb.runtime.table_def import TableDef

    store = ParameterStore(lambda: keras.optimizers.Adagrad(0.1), 0, 1, minibatch_size=100_000)
    store.init([], [TableDef("table", 16)])
    ones = np.ones((100_000, 16), np.float32)

    def update(ids_from: int, count: int, key: int) -> int:
        for start in range(ids_from, ids_from + count, 100_000):
            store.push(0, 0, key, {}, {"table": (np.arange(start, start + 100_000), ones)}, None)
            key += 1
        return key

    key = update(0, rows, 0)
    out = {"rows": rows, "changed": changed}
    with tempfile.TemporaryDirectory() as tmp:
        directory = CheckpointDir(Path(tmp), 0, keep=1)
        for kind, since in (("whole", None), ("delta", store.version)):
            if kind == "delta":
                key = update(rows // 2, changed, key)
            t0 = time.perf_counter()
            state = store.snapshot(since)
            locked = time.perf_counter() - t0
            path = directory.save(state)
            store.saved(state["version"])
            out[kind] = {
                "rows_saved": sum(len(t.ids) for t in state["tables"]),
                "snapshot_s": locked,
                "save_s": time.perf_counter() - t0,
                "bytes": path.stat().st_size,
            }
            harness.log(f"  {kind}: {out[kind]}")
        t0 = time.perf_counter()
        restored, _ = directory.load_newest()
        out["restore_s"] = time.perf_counter() - t0
        assert len(restored["tables"][0].ids) == rows
    return out


# ---------------------------------------------------------------------------- parent


def _full_table_tree() -> Path:
    """The tree of FULL_TABLE_COMMIT (its package, bench and examples), exported once."""
    target = Path.home() / ".cache" / "elasticdl-nb" / "bench-trees" / FULL_TABLE_COMMIT
    if (target / "elasticdl_nb" / "__init__.py").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(harness.ROOT), "archive", FULL_TABLE_COMMIT, "elasticdl_nb"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def _child(side: str, args: argparse.Namespace, pythonpath: Path | None = None) -> dict:
    out = Path(harness.RESULTS_DIR) / f".embeddings-{side}.json"
    env = harness.pinned_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    command = [harness.PY, __file__, "--side", side, "--out", str(out)]
    command += ["--quick"] if args.quick else []
    subprocess.run(command, env=env, check=True, cwd=Path(__file__).parent)
    result = json.loads(out.read_text())
    out.unlink()
    return result


def _plot(bounded_run: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = bounded_run["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for ps in range(len(samples[-1]["rows"])):
        top.plot(t, [s["rows"][ps] / 1e6 for s in samples], label=f"PS {ps}")
        bottom.plot(t, [s["rss_mib"][ps] if ps < len(s["rss_mib"]) else 0 for s in samples])
    top.axhline(bounded_run["max_rows"] / 2 / 1e6, color="grey", ls="--", label="max_rows / 2")
    top.set_ylabel("rows held (millions)")
    top.legend()
    bottom.set_ylabel("PS RSS (MiB)")
    bottom.set_xlabel("minutes")
    fig.suptitle("Ids from a 1e9 range, max_rows 5M: PS rows and memory over time")
    path = harness.ROOT / "bench" / "plots" / "embedding_memory.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return str(path.relative_to(harness.ROOT))


def judge(details: dict) -> list[dict]:
    """The result rows, from the parts' measurements."""
    runs, bounded_run, cost = details["runs"], details["bounded"], details["checkpoint"]

    def rates(side: str) -> list[float]:
        return [r["samples_per_s"] for r in runs[side]]

    case = "CTR, one 10M×16 table, 1 worker + 2 PS"
    samples = bounded_run["samples"]
    end = samples[-1]["t"]

    def rss_in(lo: float, hi: float) -> list[float]:
        return [sum(s["rss_mib"]) for s in samples if lo * end <= s["t"] < hi * end]

    settled, last = rss_in(0.25, 0.5), rss_in(0.75, 1.01)
    growth = 100 * (float(np.median(last)) / float(np.median(settled)) - 1)
    peak = max(sum(s["rss_mib"]) for s in samples)
    per_million = {
        kind: {
            key: cost[kind][key] / (cost[kind]["rows_saved"] / 1e6)
            for key in ("snapshot_s", "save_s")
        }
        for kind in ("whole", "delta")
    }
    return [
        harness.row(
            case,
            "training throughput",
            rates("ours"),
            rates("full"),
            unit="samples/s",
            baseline_label=f"full-size worker tables ({FULL_TABLE_COMMIT})",
            target=0.9,
        ),
        harness.row(
            case,
            "training throughput",
            rates("ours"),
            rates("fit"),
            unit="samples/s",
            baseline_label="Keras model.fit, 1 process",
        ),
        harness.row(
            case,
            "peak RSS of the worker while training",
            [r["worker_peak_mib"] for r in runs["ours"]],
            [r["worker_peak_mib"] for r in runs["full"]],
            unit="MiB",
            baseline_label="full-size worker tables",
            higher_is_better=False,
            note="with the export of the whole model after training: ours "
            f"{max(r['worker_peak_with_export_mib'] for r in runs['ours']):.0f} MiB",
        ),
        harness.row(
            case,
            "peak RSS of a PS while training",
            [r["ps_peak_mib"] for r in runs["ours"]],
            [r["ps_peak_mib"] for r in runs["full"]],
            unit="MiB",
            baseline_label="full-size worker tables",
            higher_is_better=False,
        ),
        harness.row(
            case,
            "peak RSS, worker + 2 PS while training, vs fit",
            [r["worker_peak_mib"] + 2 * r["ps_peak_mib"] for r in runs["ours"]],
            [r["process_peak_mib"] for r in runs["fit"]],
            unit="MiB",
            baseline_label="Keras model.fit process",
            higher_is_better=False,
        ),
        harness.row(
            f"ids from a 1e9 range, max_rows 5M, {end / 60:.0f} min",
            "PS RSS growth, last quarter vs second quarter (medians)",
            [growth],
            unit="%",
            higher_is_better=False,
            limit=10.0,
            note=(
                f"rows per PS at most {max(max(s['rows']) for s in samples):,} (cap 2.5M + 5 %); "
                f"RSS of both PS: median {np.median(last):.0f} MiB, peak {peak:.0f} MiB "
                "(checkpoints); plot: bench/plots/embedding_memory.png"
            ),
        ),
        harness.row(
            f"PS checkpoint, 1M of {cost['rows'] / 1e6:.0f}M rows × 16 changed",
            "seconds per checkpoint",
            [cost["delta"]["save_s"]],
            [cost["whole"]["save_s"]],
            unit="s",
            baseline_label="the whole table",
            higher_is_better=False,
            note=(
                f"per million rows saved: delta {per_million['delta']['save_s']:.2f} s "
                f"(under the lock {per_million['delta']['snapshot_s']:.2f} s), whole "
                f"{per_million['whole']['save_s']:.2f} s (under the lock "
                f"{per_million['whole']['snapshot_s']:.2f} s); restore of the chain "
                f"{cost['restore_s']:.1f} s"
            ),
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument(
        "--parts", default="A,B,C", help="which parts to measure ('none': judge the last ones)"
    )
    parser.add_argument("--side", choices=["ours", "full", "fit", "bounded", "checkpoint"])
    parser.add_argument("--out")
    args = parser.parse_args()
    records, epochs = (51_200, 2) if args.quick else (102_400, 3)
    if args.side:
        harness.pin_threads()
        sys.path.insert(0, str(Path(__file__).parent))
        seconds = MEASURE_SECONDS / 4 if args.quick else MEASURE_SECONDS
        if args.side == "fit":
            result = side_fit(records, epochs, seconds)
        elif args.side == "bounded":
            result = bounded(2 if args.quick else 10)
        elif args.side == "checkpoint":
            result = checkpoint_cost(4_000_000, 1_000_000)
        else:
            result = side_job(records, epochs, seconds)
        Path(args.out).write_text(json.dumps(result))
        return 0

    t0 = time.perf_counter()
    parts = set(args.parts.split(","))
    previous = harness.RESULTS_DIR / "embeddings.json"
    details: dict = {"measured": {}}
    if previous.exists():  # the parts not measured now keep their figures and dates
        before = json.loads(previous.read_text())
        details = before["details"]
        details.setdefault("measured", dict.fromkeys("ABC", before["machine"]["date"]))
    today = harness.machine()["date"]
    if "A" in parts:
        tree = _full_table_tree()
        runs: dict[str, list[dict]] = {"ours": [], "full": [], "fit": []}
        for rep in range(2):
            for side in ("ours", "full", "fit"):
                harness.log(f"A, run {rep + 1}: {side}")
                runs[side].append(_child(side, args, tree if side == "full" else None))
                harness.log(f"  -> {json.dumps(runs[side][-1])[:300]}")
        details["runs"], details["measured"]["A"] = runs, today
    if "B" in parts:
        harness.log("B: bounded PS memory")
        details["bounded"], details["measured"]["B"] = _child("bounded", args), today
        _plot(details["bounded"])
    if "C" in parts:
        harness.log("C: checkpoint cost")
        details["checkpoint"], details["measured"]["C"] = _child("checkpoint", args), today
    rows = judge(details)
    harness.write_result(
        "embeddings",
        "Embedding tables on the PS only: vs full-size worker tables and fit; bounded memory",
        rows,
        details,
        command=" ".join([".venv/bin/python bench/embeddings.py", *sys.argv[1:]]),
        seconds=time.perf_counter() - t0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
