"""`Job`: the handle on a running or finished job, for status, events, scaling and results.

Every view of a job — the progress line, `metrics()`, and later the widgets and the
sidebar — is built from one thing: the master's event journal, read with `events()`.
While the master runs it streams the journal (resuming from the last sequence number
after a dropped connection); once the job has ended, the journal file is read instead.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from elasticdl_nb.backends import get_backend
from elasticdl_nb.backends.job_records import JobRecord
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.journal import Event, read_journal_file
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.protocol.patience import (
    Backoff,
    Patience,
    PeerUnreachable,
    transient,
    wrong_peer,
)
from elasticdl_nb.runtime.protocol.tls import MASTER
from elasticdl_nb.sdk.errors import (
    JobFailed,
    JobNotRunning,
    NoModelYet,
    NoPredictionsYet,
    NoSuchLog,
    ScaleRefused,
    UnknownRole,
)
from elasticdl_nb.spec import SpecError, worker_range
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind, JobState, Role

# How long a call from here waits out a master that does not answer (busy or paused)
# before this process falls back to the job's files or reports the master unreachable.
NOTEBOOK_PATIENCE = Patience(seconds=15)


class Job:
    """A job, running or finished, as its backend's `MasterLink` reaches it: `status()`,
    `events()`, `metrics()`, `logs()`, `scale()`, `stop()`, `wait()`, `model()` and
    `saved_model()`.

    Made by `train` and `attach` (never directly); cheap to make again, holds no thread,
    and works in any process of this machine that can read the job's record."""

    def __init__(self, record: JobRecord):
        self._record = record
        self._link = get_backend(record.backend).link(record)
        # By patience, on the master at `_stub_address` (status() retries by itself).
        self._stubs: dict[Patience | None, rpc.MasterStub] = {}
        self._stub_address = ""

    @property
    def name(self) -> str:
        return self._record.name

    @property
    def backend(self) -> str:
        return self._record.backend

    @property
    def created(self) -> float:
        """When the job was submitted (Unix seconds)."""
        return self._record.created

    @property
    def dir(self):
        """Where the job's files are: journal, logs, checkpoints, exported model."""
        return self._link.files

    @property
    def _files(self) -> JobDir:
        return JobDir(self.dir)

    @property
    def bundle_dir(self):
        """The model bundle as this machine captured it (the job runs a copy of it)."""
        return self._record.files.bundle

    def _ended(self) -> bool:
        """Over, one way or another: an end state was recorded, or the master is lost."""
        return bool(self._link.final_state() or self._link.lost_reason())

    def _master_running(self) -> bool:
        return self._link.address() is not None

    def __repr__(self) -> str:
        return f"<Job {self.name!r} {self.status().get('state')}>"

    # ------------------------------------------------------------------ master connection

    def _master(self, patience: Patience | None = NOTEBOOK_PATIENCE) -> rpc.MasterStub | None:
        """A stub on the master while it runs (else None) whose calls ride out a busy or
        briefly unreachable master for `patience` (None: each call tries once)."""
        address = self._link.address()
        if address is None:
            return None
        if self._stub_address != address:
            self._stubs, self._stub_address = {}, address
        if patience not in self._stubs:
            token, tls = self._record.token, self._record.tls
            channel = open_channel(address, token, MASTER, patience, tls)
            self._stubs[patience] = rpc.MasterStub(channel)
        return self._stubs[patience]

    # ------------------------------------------------------------------ reading

    def status(self) -> dict[str, Any]:
        """The job's state and progress: a dict with 'state', 'epoch', 'step', ...

        An ended job answers at once from what its end left (`MasterLink.final_state`),
        without asking its master. A running one is asked, riding out a busy master for
        up to NOTEBOOK_PATIENCE, but not past its end being recorded meanwhile."""
        backoff = Backoff(NOTEBOOK_PATIENCE)
        while not self._link.final_state():
            stub = self._master(patience=None)  # the retries are these, between looks
            if stub is None:
                break
            try:
                status = json.loads(stub.GetStatus(pb.Empty(), timeout=10).json)
            except grpc.RpcError as err:
                misdirected = wrong_peer(err, MASTER, self._stub_address)
                if misdirected is not None:
                    raise misdirected from None
                if not transient(err) or backoff.exhausted:
                    break  # what its files say
                backoff.wait()
                continue
            if status.get("state") in MASTER_END_STATES:
                # Decided, not yet recorded: the master is stopping the job's processes.
                # A job is over once its end is recorded, as `jobs()` says too.
                status = {**status, "state": JobState.RUNNING, "ending": status["state"]}
            return status
        final = self._link.final_state()
        if final:
            return final
        waiting = self._link.waiting_reason()
        if waiting:
            return {"name": self.name, "state": JobState.STARTING, "waiting": waiting}
        lost = self._link.lost_reason()
        if lost:
            return {"name": self.name, "state": JobState.LOST, "error": lost}
        return {"name": self.name, "state": JobState.STARTING}

    def events(
        self, from_seq: int = 0, follow: bool = True, timeout: float | None = None
    ) -> Iterator[Event]:
        """The journal from `from_seq`; with `follow`, until the job ends (or, with
        `timeout`, TimeoutError after that many seconds). Of a long job's events before
        its journal's newest compaction, those kept (docs/events.md); a
        `journal_compacted` event at each cut says which went."""
        seq = from_seq
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # An ended job's journal is whole on its volume: a follower whose stream the
            # master cut on its way out reads the rest there, rather than calling a master
            # that is gone (seen: a progress thread's three tries through the port-forward
            # to a deleted master pod, in test_kubernetes_job_end.py on a fresh clone).
            over = self._ended() and self._files.events.exists()
            stub = None if over else self._master()
            if stub is None and not self._ended():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.name!r}: not started within {timeout} s")
                time.sleep(0.5)  # its master is not up yet (a pod being scheduled)
                continue
            if stub is None:
                for event in read_journal_file(self._files.events, seq):
                    yield event
                return
            try:
                left = None if deadline is None else max(0.01, deadline - time.monotonic())
                stream = stub.StreamEvents(
                    pb.EventsRequest(from_seq=seq, follow=follow), timeout=left
                )
                for message in stream:
                    event = Event(message.seq, message.time, message.kind, json.loads(message.data))
                    seq = event.seq + 1
                    yield event
                return  # the journal closed: the job is over
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TimeoutError(f"job {self.name!r}: no end within {timeout} s") from None
                if not transient(err) and err.code() != grpc.StatusCode.CANCELLED:
                    raise
                time.sleep(0.2)  # the master is exiting, busy or briefly unreachable

    def metrics(self) -> dict[str, list]:
        """Training loss by step and every evaluation so far, from the journal (a long
        job's losses before its journal's newest compaction are a thinned sample:
        docs/events.md)."""
        loss: list[tuple[int, float]] = []
        evaluations: list[dict] = []
        for event in self.events(follow=False):
            if event.kind == EventKind.LOSS:
                loss.extend((int(s), float(v)) for s, v in event.data["points"])
            elif event.kind == EventKind.EVALUATION:
                evaluations.append({"step": event.data["step"], **event.data["metrics"]})
        return {"loss": loss, "evaluation": evaluations}

    def logs(self, role: str = "master", index: int = 0, tail: int | None = None) -> str:
        """The log of one process: role 'master', 'worker' or 'ps', and its id."""
        if role not in set(Role):
            raise UnknownRole(f"No role {role!r}: a job's processes are master, worker and ps.")
        path = self._files.log(role, index)
        if path.exists():
            text = path.read_text(errors="replace")
            return "\n".join(text.splitlines()[-tail:]) if tail else text
        if not self._files.logs.is_dir():  # not made yet, or the job's volume is not here
            text = self._link.read_log(role, index, tail)
            if text is not None:
                return text
            raise NoSuchLog(
                f"No log for {role} {index} of job {self.name!r}: its log directory is not "
                f"visible here ({self._files.logs}), and the backend keeps none for it "
                "(its process is gone, or has not started)."
            )
        known = sorted(p.stem for p in self._files.logs.glob("*.log"))
        raise NoSuchLog(
            f"No log for {role} {index} of job {self.name!r}; there are "
            f"logs for: {', '.join(known) or 'nothing yet'}."
        )

    # ------------------------------------------------------------------ steering

    def scale(self, workers: int | str | tuple[int, int]) -> dict:
        """Change the number of workers while the job runs: a number N (a fixed size, as
        `workers=N` at the start), or a range 'MIN:MAX' / (MIN, MAX)."""
        try:
            low, high = worker_range(workers)
        except SpecError as exc:
            raise ScaleRefused(f"Cannot scale job {self.name!r}: {exc}") from None
        if isinstance(high, bool) or not isinstance(high, int):
            raise ScaleRefused(
                f"Cannot scale job {self.name!r}: workers={workers!r} is not a number of "
                "workers: give N (e.g. 3) or a range 'MIN:MAX' (e.g. '2:6')."
            )
        stub = self._require_master("scale")
        request = pb.ScaleRequest(workers=high, min_workers=low or 0)
        try:
            return json.loads(stub.Scale(request, timeout=10).json)
        except grpc.RpcError as err:
            raise ScaleRefused(f"Cannot scale job {self.name!r}: {err.details()}") from None
        except PeerUnreachable as exc:
            raise ScaleRefused(f"Cannot scale job {self.name!r}: {exc}") from None

    def stop(self, timeout: float = 30.0) -> dict:
        """Stop the job and every process of it; returns the final status."""
        stub = self._master()
        if stub is not None:
            try:
                stub.Stop(pb.StopRequest(reason="stopped by the user"), timeout=10)
            except (grpc.RpcError, PeerUnreachable):
                pass  # it is killed below
            deadline = time.monotonic() + timeout
            while self._master_running() and time.monotonic() < deadline:
                time.sleep(0.1)
        if not self._link.final_state():  # still running, or never got to run
            self._link.kill()
            deadline = time.monotonic() + timeout
            while not self._ended() and time.monotonic() < deadline:
                time.sleep(0.2)
        return self.status()

    def _require_master(self, what: str) -> rpc.MasterStub:
        stub = self._master()
        if stub is None:
            raise JobNotRunning(
                f"Cannot {what} job {self.name!r}: it is "
                f"{self.status().get('state')}, its master is not running."
            )
        return stub

    # ------------------------------------------------------------------ results

    def wait(self, timeout: float | None = None, progress: bool = True) -> dict:
        """Block until the job ends (printing progress); returns the final status.
        Raises JobFailed if it failed, TimeoutError if `timeout` passes first."""
        from elasticdl_nb.sdk.progress import ProgressPrinter

        printer = ProgressPrinter(self.name) if progress else None
        # Only the printer needs the history (its figures fold it): without it, follow
        # from the journal's end. Streaming a running job's whole journal costs its
        # master the GIL its workers' calls wait for: a worker's step 100 ms late at
        # ~2,000 events (bench/recovery.py, the kill gap).
        start = 0 if printer else self._journal_length()
        for event in self.events(start, timeout=timeout):
            if printer:
                printer.show(event)
            if event.kind == EventKind.JOB_STATE and event.data["state"] in MASTER_END_STATES:
                break
        status = self._final_status()
        if status.get("state") not in (JobState.SUCCEEDED, JobState.STOPPED):
            raise JobFailed(
                f"Job {self.name!r} {status.get('state')}: {status.get('error')}\n"
                f"End of the master's log:\n{self._files.log_tail(Role.MASTER, lines=15)}"
            )
        return status

    def _journal_length(self) -> int:
        """How many events the journal holds now (0 if the master cannot say)."""
        try:
            return int(self.status().get("events") or 0)
        except Exception:  # not started, or briefly unreachable: follow from the start
            return 0

    def _final_status(self, wait_seconds: float = 30.0) -> dict:
        """The end state, once the master has stopped every process and exited."""
        deadline = time.monotonic() + wait_seconds
        while self._master_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.status()

    def _export_format(self) -> str:
        """The spec's `export_format` (keras, saved_model or both)."""
        try:
            return self._files.read_spec().export_format
        except (OSError, ValueError):  # no spec, or no valid one (SpecError, bad JSON)
            return "keras"

    def _exported(self, path: Path, note: Path, what: str) -> Path:
        """`path`, once the job exported it; else NoModelYet saying why not."""
        if path.exists():
            return path
        if note.exists():
            raise NoModelYet(note.read_text().strip())
        raise NoModelYet(
            f"Job {self.name!r} has not exported its {what} yet (state: "
            f"{self.status().get('state')}); it is written when the job succeeds."
        )

    @property
    def saved_model_path(self) -> Path:
        """The folder of the job's TensorFlow SavedModel (export_format 'saved_model' or
        'both'), once exported: `tf.saved_model.load(job.saved_model_path)`, then its
        `serve(inputs)` or `signatures['serving_default']`."""
        if self._export_format() == "keras":
            raise NoModelYet(
                f"Job {self.name!r} exports a Keras file only (export_format='keras'): "
                "job.model() loads it. Train with export_format='saved_model' or 'both' "
                "for a TensorFlow SavedModel."
            )
        files = self._files
        return self._exported(files.saved_model, files.saved_model_not_exported, "SavedModel")

    def saved_model(self):
        """The job's TensorFlow SavedModel, loaded into this process (`tf.saved_model.load`):
        call `.serve(inputs)`, or `.signatures['serving_default'](**inputs)`. Keep the
        object while you call it (its functions use its variables, which go with it)."""
        import tensorflow as tf

        return tf.saved_model.load(str(self.saved_model_path))

    def predictions(self) -> Any:
        """The trained model's outputs for the job's `prediction_data`, in the data's
        order: one array, or a dict or list of them as the model's outputs are. Ready once
        the job has predicted (after training and the final evaluation, before the export:
        the `predictions` event)."""
        from elasticdl_nb.runtime.predictions import IncompletePredictions, read_predictions

        files = self._files
        sources = json.loads(files.sources.read_text()).get("prediction", [])
        if not sources:
            raise NoPredictionsYet(
                f"Job {self.name!r} has no prediction data: train with prediction_data= "
                "(--prediction-data) to have it predict for a data set once trained."
            )
        try:
            return read_predictions(files.predictions, [s["num_records"] for s in sources])
        except IncompletePredictions as exc:
            raise NoPredictionsYet(
                f"Job {self.name!r} has not predicted for all of its prediction data ({exc}; "
                f"state: {self.status().get('state')}): its workers do once it is trained."
            ) from None

    def model(self):
        """The trained Keras model, loaded into this process: a Keras-2 job's is a tf_keras
        model, in a Keras-3 process too (the two live side by side)."""
        from elasticdl_nb.keras_flavor import VERSION

        files = self._files
        if self._export_format() == "saved_model" and not files.model.exists():
            raise NoModelYet(
                f"Job {self.name!r} exports a TensorFlow SavedModel only "
                f"(export_format='saved_model'), not a Keras file: it is in "
                f"{files.saved_model} (job.saved_model() loads it, job.saved_model_path "
                "says where). Train with export_format='both' for a Keras model too."
            )
        path = self._exported(files.model, files.model_not_exported, "model")
        from elasticdl_nb.model import load_bundle
        from elasticdl_nb.model.keras_classes import keras_classes

        # Keras finds a model-zoo module's or a notebook's own classes only when given them;
        # safe_mode off: the file is the user's own job's, and Lambda layers need it (as
        # for a captured model: capture/keras_models.py).
        ran = self._keras_version()
        if ran not in ("auto", VERSION):  # (a job from before: "auto")
            # The other Keras's model: its own package loads it, beside this one's; the
            # model's own classes, which this process made in its Keras, cannot go with it.
            other = importlib.import_module("keras" if VERSION == "2" else "tf_keras")
            try:
                return other.models.load_model(path, compile=False, safe_mode=False)
            except (TypeError, ValueError) as exc:
                served = (
                    "its SavedModel serves here and needs no classes: job.saved_model()"
                    if files.saved_model.exists()
                    else "or train with export_format='both' and call job.saved_model(), "
                    "which needs no classes"
                )
                raise NoModelYet(
                    f"Job {self.name!r} ran Keras {ran}, and this process runs Keras "
                    f"{VERSION}: {exc} Its model has classes of its own, which load only "
                    f"where Keras {ran} runs: in a notebook started with TF_USE_LEGACY_KERAS="
                    f"{'1' if ran == '2' else '0'}; {served}."
                ) from exc
        from elasticdl_nb.keras_flavor import keras

        contract = load_bundle(files.bundle)
        return keras.models.load_model(
            path, compile=False, custom_objects=keras_classes(contract), safe_mode=False
        )

    def _keras_version(self) -> str:
        """The Keras the job ran: '2' or '3'."""
        try:
            return self._files.read_spec().keras_version
        except (OSError, ValueError):
            return "3"
