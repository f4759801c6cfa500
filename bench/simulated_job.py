"""The job whose workers are simulated (bench/many_workers.py): its directory, its master
and PS processes, and the load generators that run its workers.

- `prepare_job`: the job directory as `edl.train` writes it (sdk/api.py), by the same
  steps: the record and token, the bundle of a model-zoo module (synthetic_digits.py),
  the custom reader's shards as sources, the spec, the one-minibatch preflight.
- `running_job`: the master process, then the PS initialized as a worker does it, then the
  load generators (simulated_workers.py); each in a process group of its own, all killed
  on the way out, whatever happens.
- The master process (`serve_master`) is the runtime's `serve`, the whole life of a
  job's master, with the local backend's site (a Unix socket in the job directory, the
  master lock), whose launcher is the one thing changed (`SimulatedWorkersLauncher`): the
  PS is started as a local job's supervisor starts it (`LocalProcesses`), and a worker
  launched is one a load generator runs, so launching it only reports it started and
  running. The supervisor is left out: it restarts a master that dies and starts every
  worker as a process itself; the site is the plug the runtime defines for where
  instances come from, so that is where the simulation goes in.
- `ProcessSample`: a process's CPU time, RSS, threads and sockets, from /proc.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import PY, ROOT, pinned_env

from elasticdl_nb.backends import job_records
from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.backends.local.master_site import LocalSite
from elasticdl_nb.backends.local.processes import LocalProcesses, terminate
from elasticdl_nb.runtime.logs import LOG_DIR_ENV, setup_logging
from elasticdl_nb.runtime.master.site import EventSink, InstanceEvent
from elasticdl_nb.runtime.process_env import MASTER_PATIENCE
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.protocol.tls import MASTER
from elasticdl_nb.vocabulary import INSTANCE_ENDED, InstanceState, Role

log = logging.getLogger("elasticdl_nb.master")

BENCH = Path(__file__).resolve().parent
ZOO = BENCH / "synthetic_digits.py"
MINIBATCH, PER_TASK = 64, 8  # the JobSpec defaults
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LAUNCH_MASTER = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from simulated_job import serve_master; serve_master(sys.argv[2])"
)


# ---------------------------------------------------------------------------- the master


class SimulatedWorkersLauncher:
    """The site's launcher (`runtime.master.site.InstanceLauncher`): the PS is started as
    a local job's are (`LocalProcesses`); a worker is only reported started, and killed
    when the master kills it, since a load generator runs it (the benchmark asks the
    master which workers it runs). Events reach the master from a thread of their own,
    in order, as the supervisor's do (the sink takes the master's lock)."""

    def __init__(self, job_dir: Path, env: dict[str, str], on_event: EventSink):
        self._env, self._on_event = env, on_event
        self._processes = LocalProcesses(job_dir, dict(os.environ))
        self._lock = threading.Lock()  # (LocalProcesses: one thread at a time)
        self._events: queue.SimpleQueue[InstanceEvent | threading.Event] = queue.SimpleQueue()
        self._workers: set[int] = set()
        threading.Thread(target=self._deliver, daemon=True, name="instance-events").start()
        threading.Thread(target=self._reap, daemon=True, name="reaper").start()

    def launch(self, role: str, instance_id: int, elastic: bool = False) -> None:
        if role == Role.PS:
            with self._lock:
                self._put(self._processes.launch(role, instance_id, self._env))
            return
        self._workers.add(instance_id)  # (started, as a local job's worker is reported)
        self._events.put(InstanceEvent(Role.WORKER, instance_id, InstanceState.STARTED))

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        if role == Role.PS:
            with self._lock:
                self._processes.kill(role, instance_id, force)
        elif instance_id in self._workers:
            self._workers.discard(instance_id)
            self._events.put(
                InstanceEvent(Role.WORKER, instance_id, InstanceState.KILLED, signal="SIGKILL")
            )

    def grow_memory(self, role: str) -> str | None:
        return None

    def shutdown(self, grace_seconds: float) -> None:
        for worker in sorted(self._workers):
            self.kill(Role.WORKER, worker)
        with self._lock:
            terminate(self._processes.live(), grace_seconds)
        self._reap_once()
        delivered = threading.Event()
        self._events.put(delivered)
        delivered.wait(10)

    def adopt(self) -> set[tuple[str, int]]:
        return set()  # (no master of this job ran before)

    def _put(self, event: dict[str, Any]) -> None:
        self._events.put(InstanceEvent(**{**event, "kind": InstanceState(event["kind"])}))

    def _reap_once(self) -> None:
        with self._lock:
            for event in self._processes.reap():
                self._put(event)

    def _reap(self) -> None:
        while True:
            time.sleep(0.2)
            self._reap_once()

    def _deliver(self) -> None:
        while True:
            item = self._events.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._on_event(item)
            except Exception:  # one bad event must not end the delivery of the others
                log.exception("instance event %s", item)


class SimulatedWorkersSite(LocalSite):
    """A local job's site, with its workers simulated elsewhere."""

    def launcher(self, env: dict[str, str], on_event: EventSink) -> SimulatedWorkersLauncher:
        return SimulatedWorkersLauncher(self.job_dir, env, on_event)


def serve_master(job_dir: str) -> None:
    """The master process (started with `LAUNCH_MASTER`)."""
    from elasticdl_nb.runtime.master.serve import serve

    setup_logging("master")
    serve(Path(job_dir), lambda spec, path: SimulatedWorkersSite(path))


# ---------------------------------------------------------------------------- the job


def prepare_job(workers: int, records: int) -> JobRecord:
    """The job directory as `edl.train` writes it (sdk/api.py), through the same steps."""
    from elasticdl_nb.capture import write_bundle
    from elasticdl_nb.model import load_bundle
    from elasticdl_nb.model.custom_data_reader import custom_sources, reader_params
    from elasticdl_nb.sdk.preflight import check_job
    from elasticdl_nb.spec import JobSpec

    spec = JobSpec.from_options(
        model_zoo=str(ZOO),
        model_def=f"{ZOO.stem}.custom_model",
        data=["synthetic-digits"],
        data_reader_params=f"records={records}",
        workers=workers,
        ps=1,
        epochs=1000,  # (stopped long before)
        minibatch_size=MINIBATCH,
        minibatches_per_task=PER_TASK,
    )
    record = job_records.create_job(f"many-workers-{time.strftime('%H%M%S')}")
    files = record.files
    write_bundle(files.bundle, model_zoo=spec.model_zoo, model_def=spec.model_def)
    reader = load_bundle(files.bundle).custom_data_reader
    params = reader_params(spec.data_reader_params)
    train = custom_sources(reader, "data", spec.data[0], spec.records_per_task, params)
    spec.name = record.name
    spec.validate()
    files.sources.write_text(json.dumps({"train": [s.to_dict() for s in train], "validation": []}))
    check_job(files, spec, {"data": train, "validation_data": [], "prediction_data": []})
    files.spec.write_text(spec.to_json())
    return record


def initialize_ps(record: JobRecord, master: rpc.MasterStub) -> list[tuple[str, list[int]]]:
    """Offer the model's initial values to the PS as a worker does; returns the dense
    variables' names and shapes (what the simulated workers push)."""
    import numpy as np

    from elasticdl_nb.model import load_bundle
    from elasticdl_nb.runtime.worker.model_runner import ModelRunner
    from elasticdl_nb.runtime.worker.ps_client import PsClient

    runner = ModelRunner(load_bundle(record.files.bundle))
    runner.build(np.zeros((MINIBATCH, 64), np.float32))
    variables = runner.variable_values()
    ps = PsClient(lambda: master.GetPsAddresses(pb.Empty(), timeout=10).addresses, record.token)
    ps.set_model(variables, [])
    ps.initialize()
    return [(name, list(value.shape)) for name, value in variables]


# ---------------------------------------------------------------------------- processes


@dataclass
class ProcessSample:
    """One look at a process in /proc."""

    at: float
    cpu_s: float  # user + system, every thread
    rss_mb: float
    threads: int
    sockets: int

    @classmethod
    def of(cls, pid: int) -> ProcessSample | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
            fds = os.listdir(f"/proc/{pid}/fd")
        except (OSError, ValueError):
            return None  # it has exited
        return cls(
            time.monotonic(),
            (int(stat[11]) + int(stat[12])) / CLOCK_TICKS,
            int(status["VmRSS"].split()[0]) / 1024,
            int(status["Threads"]),
            sum(_is_socket(pid, fd) for fd in fds),
        )


def _is_socket(pid: int, fd: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    except OSError:
        return False  # closed since it was listed


def cpu_percent(before: ProcessSample | None, after: ProcessSample | None) -> float | None:
    if before is None or after is None or after.at <= before.at:
        return None
    return 100 * (after.cpu_s - before.cpu_s) / (after.at - before.at)


class GeneratorProcess:
    """A load-generator process (simulated_workers.py) and its command line."""

    def __init__(self, record: JobRecord, setup: dict, index: int):
        env = pinned_env({TOKEN_ENV: record.token, "PYTHONPATH": f"{ROOT}{os.pathsep}{BENCH}"})
        log_file = open(record.files.logs / f"generator-{index}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [PY, str(BENCH / "simulated_workers.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
            start_new_session=True,
            text=True,
        )
        log_file.close()
        self.send(setup)

    def send(self, command: dict) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def start(self, ids: list[int]) -> None:
        self.send({"op": "start", "workers": ids})

    def mark(self) -> dict:
        self.send({"op": "mark"})
        return self.read()

    def read(self, timeout: float = 60.0) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"load generator {self.proc.pid} did not answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator {self.proc.pid} exited ({self.proc.poll()})")
        return json.loads(line)


@dataclass
class Job:
    """The running job: its master (and the PS it started) and the load generators. Every
    process is the leader of its own process group; `close` kills the groups."""

    record: JobRecord
    master_proc: subprocess.Popen
    master: rpc.MasterStub
    generators: list[GeneratorProcess] = field(default_factory=list)
    driven: set[int] = field(default_factory=set)  # the workers the generators run
    behind: bool = False  # the master said it was saturated, and not yet caught up
    _ps_pid: int | None = field(default=None, init=False)

    @property
    def master_pid(self) -> int:
        return self.master_proc.pid

    def ps_pid(self) -> int | None:
        """The PS's process id (asked again only once the one known has gone)."""
        if self._ps_pid is None or not Path(f"/proc/{self._ps_pid}").exists():
            self._ps_pid = next(
                (
                    inst["pid"]
                    for inst in self.status()["instances"]
                    if inst["role"] == Role.PS and inst["state"] not in INSTANCE_ENDED
                ),
                None,
            )
        return self._ps_pid

    def status(self) -> dict:
        return json.loads(self.master.GetStatus(pb.Empty(), timeout=30).json)

    def grow_to(self, workers: int) -> None:
        """Ask the master for `workers` workers, then run the new ones, round robin."""
        if workers != self.status()["desired_workers"]:
            self.master.Scale(pb.ScaleRequest(workers=workers), timeout=30)
        deadline = time.monotonic() + 60
        while True:
            running = {
                i["id"]
                for i in self.status()["instances"]
                if i["role"] == Role.WORKER and i["state"] not in INSTANCE_ENDED
            }
            if len(running) >= workers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        new = sorted(running - self.driven)
        for g, generator in enumerate(self.generators):
            share = new[g :: len(self.generators)]
            if share:
                generator.start(share)
        self.driven |= set(new)

    def mark(self) -> list[dict]:
        return [generator.mark() for generator in self.generators]

    def close(self) -> None:
        """Stop the job (Stop RPC, then the generators), and kill whatever is left."""
        with contextlib.suppress(Exception):
            self.master.Stop(pb.StopRequest(reason="benchmark done"), timeout=10)
        for generator in self.generators:
            with contextlib.suppress(Exception):
                generator.send({"op": "stop"})
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.master_proc.wait(30)
        for proc in [self.master_proc, *(g.proc for g in self.generators)]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def running_job(
    record: JobRecord, setup_for: Callable[[list], dict[str, Any]], generators: int
) -> Iterator[Job]:
    """Start the master (which starts the PS), initialize the PS, start the generators;
    on the way out, end all of them. `setup_for(variables)`: the generators'
    `simulated_workers.Setup`, but for where the master is and the minibatch size."""
    files = record.files
    files.logs.mkdir(exist_ok=True)
    env = pinned_env(
        {
            TOKEN_ENV: record.token,
            LOG_DIR_ENV: str(files.logs),
            "PYTHONPATH": f"{ROOT}{os.pathsep}{BENCH}",
            "TMPDIR": str(record.dir),
            "GRPC_ENABLE_FORK_SUPPORT": "false",  # (as a local job's: it starts the PS)
        }
    )
    with open(files.logs / "master.out", "ab") as out:
        proc = subprocess.Popen(
            [PY, "-c", LAUNCH_MASTER, str(BENCH), str(record.dir)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    job: Job | None = None
    try:
        deadline = time.monotonic() + 60
        while not files.master.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the master did not start:\n{files.log_tail('master')}")
            time.sleep(0.1)
        address = json.loads(files.master.read_text())["address"]
        channel = open_channel(address, record.token, MASTER, MASTER_PATIENCE)
        job = Job(record, proc, rpc.MasterStub(channel))
        variables = initialize_ps(record, job.master)
        setup = setup_for(variables) | {"master": address, "minibatch_size": MINIBATCH}
        job.generators = [GeneratorProcess(record, setup, i) for i in range(generators)]
        yield job
    finally:
        if job is not None:
            job.close()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
