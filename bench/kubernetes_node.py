"""Kubernetes: the same digits job on the real test node and on local processes, in one run.

    .venv/bin/python bench/kubernetes_node.py [--quick]

Needs root and what `make test-cluster` and `make test-node` build; without them it writes
a result that says why it was skipped (no rows) and exits 0. The real node is a singleton
on the machine: its start waits for another session's node to stop (node.MACHINE_LOCK).

Set-up: one real node for the whole run (tests/kubernetes/node_session.py, what the tests'
`real_node` fixture starts: containerd + runc, kubelet, kube-scheduler and kube-proxy
beside a test API server), one namespace set up as an admin would (deploy/rbac.yaml, its
user Role bound to the cluster's unprivileged user, the priority classes). This process
is the notebook: it submits as that user, from outside the pod network. Every pod is a
container of the job image requesting `tests/kubernetes/job_pods.SMALL` (cpu=100m,
memory=1Gi, the memory also its limit), so that master, PS and workers fit the node's 2
cores, and mounts a hostPath directory (mode 0777: hostPath ignores fsGroup, and the pods
run as uid 1000). The pods get the benchmark's thread pins through the job's `env` (the
local processes inherit them): one intra-op and one inter-op TensorFlow thread each.

The job, on both sides: the digits MLP of bench/workloads.py (64-64-10, Adam, 1,408
records, batch 64, 11 minibatches per task), 2 workers + 1 PS, `edl.train` with its
default one-step check in this process. First one short warm-up job per side (not
counted: this process's first `train()` traces the check step, the first pod start
reads the image's files); then per repeat (1 with --quick, 2 without) a throughput job
and a fault job on each side, the side going first alternating between repeats.

Times are journal times (the master's clock; the pods share this machine's) or this
process's clock. The benchmark follows a job by reading its journal file (events.jsonl,
a line per event, flushed; the hostPath volume is this machine's) every 50 ms, not
through the notebook's link to the master: on the real node that link is a port-forward
to the master pod, and a `job.status()` through it is timed once per throughput job
(details: `notebook_status_while_training`). A job is ended locally with `job.stop()`;
on Kubernetes by deleting its master pod as the admin (which deletes the job), and the
next job starts once the pods are gone.

1. train() to the first step: from right before `edl.train()` to the journal time of the
   first `loss` event (the master has a report of a minibatch the PS applied; workers
   report every 0.2 s, so up to 0.2 s late on both sides), on every counted job (2 per
   repeat and side). Ratio local / Kubernetes.
   Worker created to the first step: from the creation of the worker that sent that
   `loss` to that event. Kubernetes: its pod as a watch of the namespace (as the admin)
   first delivered it (creationTimestamp has whole seconds; it is in the details);
   local: the master's `instance started` event of the process. Also a row of its first
   part: created to the worker's first log line (its Python running).
   The details break each start-up down: pods scheduled, containers running and ready as
   the watch saw them (the kubelet reports a container's start after its ~1 s relist),
   the processes' first log lines, TensorFlow imported (the last import note in the
   process's output, as recovery.py reads it; in a pod from the container's log), the
   worker ready (its log line once its model is built and its step traced and run once;
   the line says when each part ended), the master running. A pod's `instance running`
   journal event is its phase Running; a local process's is its report that it is ready
   (PS only).
2. A worker lost mid-training to its replacement's first step. Once both workers have
   reported losses for STEADY seconds, worker `rep % 2` is killed: Kubernetes,
   `delete_namespaced_pod` as the admin (default grace: the kubelet sends SIGTERM, on
   which the worker exits); local, SIGKILL of its process. t_kill is taken right before
   the call; the figure is t_kill to the first `loss` event of the worker whose
   `relaunch` event replaces the victim (recovery.py's "time to replacement's first
   step"). Also a row of its first part: t_kill to the master's instance event of the
   victim's end, and of its last: the new pod's creation (the watch) / the new process's
   `instance started` event to its first step (limit 4 s on the node). Every fault job
   (here, 2b and 2c) has FAULT_EPOCHS epochs, PS checkpoints and `record_ledger=True`,
   runs to its end, and its PS ledger is read: a row of records applied twice or never
   (limit 0). Details: the victim pod's deletion and container end as the watch saw
   them, the relaunch, the new pod's phases, the new worker's first log line and
   TensorFlow import. Ratio local / Kubernetes.
2b. The same with one standby worker (`standby_workers=1`, issue 37): a pod at the
   lowest priority / a process, ready (model built, step traced) and given no work,
   takes the lost worker's place; STANDBY_REPEATS times on each side. Target: the
   median kill -> replacement's first step on the node at most 2.5 s.
2c. The PS lost instead (its pod deleted / its process SIGKILLed), PS_REPEATS times on
   each side: kill to training resumed, the first `loss` event after the relaunched PS
   restored its newest checkpoint (its `ps_restored` event). Details: its phases and the
   updates the restore rolled back (redone).
3. Steady-state samples/s of the throughput jobs (THROUGHPUT_EPOCHS epochs, for a window
   of several seconds), from the journal as throughput.py measures it
   (`workloads.steady_state`: from the first `loss` after every worker has sent one to
   the last). Ratio Kubernetes / local.

While local jobs run, the node's programs (kubelet, containerd, API server, ...) idle
beside them; while pods run, they work for them on the same 2 cores. The two sides run
different Python builds of the same version line: the pods the image's (Debian's 3.11,
built with profile-guided and link-time optimization), the local processes this venv's
(pyenv's 3.11 here, built without them, libpython shared); on this machine a pure-Python
loop ran ~20 % faster in the image's. The digits steps are short (~1.5 ms), so their
Python and gRPC overhead counts in the throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

# The repository's root goes on the path for `tests` (the real node's helpers). (Not
# named kubernetes.py: with bench/ on the path it would hide the `kubernetes` package.)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)
from recovery import LOG_TIME, ledger_counts, tf_imported  # noqa: E402  (the same readings)

import elasticdl_nb as edl  # noqa: E402
from elasticdl_nb.backends import job_records  # noqa: E402
from elasticdl_nb.backends.local import submit  # noqa: E402
from elasticdl_nb.runtime.job_dir import JobDir  # noqa: E402
from elasticdl_nb.runtime.master.journal import Event, read_journal_file  # noqa: E402
from elasticdl_nb.vocabulary import MASTER_END_STATES  # noqa: E402
from tests.kubernetes import node_session  # noqa: E402

WORKERS, PS = 2, 1
THROUGHPUT_EPOCHS = {True: 150, False: 300}  # by --quick: a steady window of ~4-8 s
WARMUP_EPOCHS = 20
FAULT_EPOCHS = 600  # ~15-25 s: past the replacement's start, then to its end (the ledger)
CHECKPOINT_STEPS = 200  # the fault jobs' PS checkpoints (what a relaunched PS restores)
STANDBY_REPEATS = 3  # fault jobs with a standby worker, per side (a median of 3)
PS_REPEATS = 2  # fault jobs that lose the PS, per side
STEADY = 3.0  # seconds both workers have reported losses before the kill
TIMEOUT = 300.0  # seconds any one wait for a job may take
LOCAL, K8S = "local", "kubernetes"
CASE = "digits MLP, 2 workers + 1 PS"
VS = f"{CASE}, real node (pods) vs local processes"
LOCAL_LABEL = "local backend (processes)"


def small_resources() -> str:
    try:
        from tests.kubernetes.job_pods import SMALL
    except ImportError:  # a job_pods.py from before SMALL
        SMALL = "cpu=100m,memory=1Gi"
    return SMALL


# ---------------------------------------------------------------------------- pods


class PodTimeline:
    """A watch of the namespace's job pods (as the admin): for each pod incarnation, when
    this process first saw it in each state."""

    def __init__(self, admin, namespace: str):
        from kubernetes import client

        self.core = client.CoreV1Api(admin)
        self.namespace = namespace
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> name, creationTimestamp, marks
        self._lock = threading.Lock()
        self._stopped = False
        self._watch = None
        self._thread = threading.Thread(target=self._run, name="pod-timeline", daemon=True)

    def start(self) -> PodTimeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped = True
        if self._watch is not None:
            self._watch.stop()

    def _run(self) -> None:
        from kubernetes import watch

        version = None
        while not self._stopped:
            self._watch = watch.Watch()
            try:
                for event in self._watch.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector="elasticdl-nb/job",
                    resource_version=version,
                    timeout_seconds=60,
                ):
                    self._seen(event["type"], event["object"], time.time())
                    version = event["object"].metadata.resource_version
            except Exception:  # a closed stream, an expired version: list again
                version = None
                time.sleep(0.2)

    def _seen(self, kind: str, pod, now: float) -> None:
        meta, status = pod.metadata, pod.status
        containers = (status and status.container_statuses) or []
        state = containers[0].state if containers else None
        conditions = (status and status.conditions) or []
        seen = {
            "created": True,
            "scheduled": bool(pod.spec.node_name),
            "container running": bool(state and state.running),
            "ready": any(c.type == "Ready" and c.status == "True" for c in conditions),
            "deleting": bool(meta.deletion_timestamp),
            "container terminated": bool(state and state.terminated),
            "gone": kind == "DELETED",
        }
        with self._lock:
            entry = self._pods.setdefault(
                meta.uid,
                {
                    "name": meta.name,
                    "creationTimestamp": meta.creation_timestamp.timestamp(),
                    "marks": {},
                },
            )
            for what, now_so in seen.items():
                if now_so:
                    entry["marks"].setdefault(what, now)

    def marks(self, name: str, after: float = 0.0) -> dict[str, float]:
        """The marks of the first incarnation of pod `name` created after `after`."""
        with self._lock:
            found = [
                p
                for p in self._pods.values()
                if p["name"] == name and p["marks"]["created"] >= after
            ]
            if not found:
                return {}
            first = min(found, key=lambda p: p["marks"]["created"])
            return {**first["marks"], "creationTimestamp": first["creationTimestamp"]}

    def replacement(self, victim: str, new: str, t_kill: float) -> dict[str, float]:
        """The ending marks of pod `victim`'s first incarnation ("victim pod deleting",
        ...) and the starting ones of the first pod `new` created after `t_kill`."""
        ending = ("deleting", "container terminated", "gone")
        marks = {f"victim pod {w}": t for w, t in self.marks(victim).items() if w in ending}
        started = self.marks(new, t_kill).items()
        return marks | {f"new pod {w}": t for w, t in started if w not in ending}

    def busy(self, job: str) -> list[str]:
        """The pods of `job` not gone yet, but a master's that has ended (it stays)."""
        with self._lock:
            return [
                p["name"]
                for p in self._pods.values()
                if p["name"].startswith(f"{job}-")
                and "gone" not in p["marks"]
                and not (
                    p["name"].startswith(f"{job}-master") and "container terminated" in p["marks"]
                )
            ]


# ---------------------------------------------------------------------------- jobs


class Sides:
    """What differs between the sides: the options of `edl.train`, how a worker is
    killed, how a process's output is read, how a job is ended."""

    def __init__(self, session, namespace: str, shared: Path, timeline: PodTimeline):
        from kubernetes import client

        self.core = client.CoreV1Api(session.admin)
        self.namespace = namespace
        self.timeline = timeline
        small = small_resources()
        pins = {**harness.THREAD_PINS, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.k8s = dict(
            backend="kubernetes",
            namespace=namespace,
            kubeconfig=str(session.cluster.user_kubeconfig),
            shared_volume=f"hostPath:{shared}",
            master_resources=small,
            ps_resources=small,
            worker_resources=small,
            env=[f"{k}={v}" for k, v in pins.items()],
        )

    def options(self, side: str) -> dict:
        return self.k8s if side == K8S else {}

    def kill(self, side: str, job: edl.Job, role: str, index: int) -> float:
        """Delete the worker's or PS's pod / SIGKILL its process; returns the time right
        before."""
        if side == K8S:
            t = time.time()
            self.core.delete_namespaced_pod(f"{job.name}-{role}-{index}", self.namespace)
            return t
        (pid,) = [
            i["pid"]
            for i in job.status()["instances"]
            if i["role"] == role and i["id"] == index and i["pid"]
        ]
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        return t

    def output(self, side: str, job: edl.Job, role: str, index: int) -> str:
        """What a live process has written: its log in the job's directory, and in a pod
        also its container's output (TensorFlow's notes go there; a local process's
        output is its log file)."""
        try:
            text = job.logs(role, index)
        except Exception:
            text = ""
        if side == K8S:
            with contextlib.suppress(Exception):
                text += "\n" + self.core.read_namespaced_pod_log(
                    f"{job.name}-{role}-{index}", self.namespace
                )
        return text

    def end(self, side: str, job: edl.Job, ended: bool) -> None:
        """End the job unless it has `ended`, and wait until all of it has: local,
        `job.stop()`; Kubernetes, the master's Job deleted (the job with it), then until the
        job's pods are gone and the master's container has ended."""
        if side != K8S:
            job.stop()
            return
        if not ended:
            from kubernetes.client import ApiException, BatchV1Api

            with contextlib.suppress(ApiException):  # (its Job owns every object of the job)
                BatchV1Api(self.core.api_client).delete_namespaced_job(
                    f"{job.name}-master", self.namespace, propagation_policy="Background"
                )
        deadline = time.monotonic() + 120
        while self.timeline.busy(job.name) and time.monotonic() < deadline:
            time.sleep(0.2)


def start(w: workloads.Workload, sides: Sides, side: str, name: str, epochs: int, **more):
    t0 = time.time()
    job = w.train(
        workers=WORKERS,
        ps=PS,
        epochs=epochs,
        name=name,
        **sides.options(side),
        **more,
    )
    return job, t0, time.time() - t0


def tail(job: edl.Job, from_seq: int = 0) -> Iterator[Event]:
    """The job's journal as its master appends it to events.jsonl, read every 50 ms;
    TimeoutError after TIMEOUT seconds."""
    path = JobDir(job.dir).events
    deadline = time.monotonic() + TIMEOUT
    offset, partial = 0, ""
    while time.monotonic() < deadline:
        if path.exists():
            with open(path) as journal:
                journal.seek(offset)
                partial += journal.read()
                offset = journal.tell()
            *lines, partial = partial.split("\n")
            for line in lines:
                if line.strip():
                    event = Event.from_json(line)
                    if event.seq >= from_seq:
                        yield event
        time.sleep(0.05)
    raise TimeoutError(f"job {job.name}: no end in sight after {TIMEOUT:.0f} s")


def ends(event: Event) -> bool:
    return event.kind == "job_state" and event.data.get("state") in MASTER_END_STATES


def first_loss(job: edl.Job) -> Event:
    for event in tail(job):
        if event.kind == "loss":
            return event
        if ends(event):
            raise RuntimeError(f"job {job.name} ended before its first step: {event.data}")
    raise AssertionError("unreachable")


def notebook_status(job: edl.Job, out: dict) -> threading.Thread:
    """One `job.status()` as a notebook calls it while the job trains, through its link
    to the master (on the real node a port-forward): how long it took, what it said."""

    def call() -> None:
        t = time.time()
        try:
            state = job.status().get("state")
        except Exception as exc:
            state = f"{type(exc).__name__}: {exc}"[:300]
        out["notebook_status_while_training"] = {"seconds": time.time() - t, "state": state}

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def throughput_job(w, sides: Sides, side: str, tag: str, epochs: int) -> dict:
    job, t0, returned = start(w, sides, side, f"bench-{side[:3]}-rate-{tag}", epochs)
    out: dict[str, Any] = {"job": job.name}
    ended: dict = {}
    try:
        first = first_loss(job)
        outputs = early_outputs(sides, side, job, first)
        probe = notebook_status(job, out)
        ended = next(e.data for e in tail(job, first.seq + 1) if ends(e))
    finally:
        sides.end(side, job, bool(ended))
    probe.join(30)
    if ended.get("state") != "succeeded":
        raise RuntimeError(f"job {job.name} ended {ended.get('state')}: {ended.get('reason')}")
    events = list(read_journal_file(JobDir(job.dir).events))
    out["startup"] = startup_phases(job, events, sides, side, t0, returned, first, outputs)
    out["steady"] = workloads.steady_state(events, WORKERS, w.batch)
    return out


def fault_job(
    w, sides: Sides, side: str, tag: str, victim: int, standby: int = 0, role: str = "worker"
) -> dict:
    """A job of FAULT_EPOCHS whose `role` `victim` is killed once both workers have
    trained for STEADY seconds; followed to the replacement's first step (a worker) or
    to training resumed on the relaunched PS (its `instance running`, then the next
    `loss`), then to the job's end, and its PS ledger checked: every record once."""
    kind = "standby" if standby else ("fault" if role == "worker" else "psfault")
    more = {"standby_workers": standby} if standby else {}
    job, t0, returned = start(
        w,
        sides,
        side,
        f"bench-{side[:3]}-{kind}-{tag}",
        FAULT_EPOCHS,
        checkpoint_steps=CHECKPOINT_STEPS,
        record_ledger=True,
        **more,
    )
    out: dict[str, Any] = {"job": job.name, "victim": f"{role} {victim}"}
    t_kill = new_id = None
    back = replaced = False
    ended: dict = {}
    try:
        first = first_loss(job)
        outputs = early_outputs(sides, side, job, first)
        seen: set[int] = {first.data["worker"]}
        both = None
        for event in tail(job, first.seq + 1):
            now = time.time()
            if ends(event):
                ended = event.data
                break
            if t_kill is None:
                if event.kind == "loss":
                    seen.add(event.data["worker"])
                    out["step_at_kill"] = event.data["points"][-1][0]
                    if both is None and len(seen) == WORKERS:
                        both = now
                if both is not None and now - both >= STEADY:
                    t_kill = sides.kill(side, job, role, victim)
                    harness.log(f"  killed {role} {victim} past step {out['step_at_kill']}")
            elif event.kind == "relaunch" and event.data.get("role") == role:
                new_id = event.data["id"]
            elif role == "ps" and event.kind == "ps_restored" and new_id is not None:
                back = True  # (a pod's `instance running` is its phase, before the restore)
            elif event.kind == "loss" and new_id is not None and not replaced:
                if back if role == "ps" else event.data["worker"] == new_id:
                    replaced = True  # its output, read now: a pod's is gone with it
                    outputs[new_id if role == "worker" else "ps"] = sides.output(
                        side, job, role, new_id
                    )
    finally:
        sides.end(side, job, bool(ended))
    if ended.get("state") != "succeeded":
        raise RuntimeError(f"job {job.name} ended {ended.get('state')}: {ended.get('reason')}")
    if new_id is None:
        raise RuntimeError(f"job {job.name} ended before its {role} {victim} was replaced")
    out["applied_twice"], out["never_applied"] = ledger_counts(job.dir, w.records, FAULT_EPOCHS)
    events = list(read_journal_file(JobDir(job.dir).events))
    out["startup"] = startup_phases(job, events, sides, side, t0, returned, first, outputs)
    recover = recovery_phases if role == "worker" else ps_recovery_phases
    out["recovery"] = recover(events, sides, side, job, t_kill, victim, new_id, outputs)
    return out


def early_outputs(sides: Sides, side: str, job: edl.Job, first: Event) -> dict:
    """The output of the worker that made the first step, read at once (a pod's container
    output is gone with its pod)."""
    worker = first.data["worker"]
    return {worker: sides.output(side, job, "worker", worker)}


# ---------------------------------------------------------------------------- analysis


def first_event(events: list, what: str, after: float = 0.0, **match: Any) -> Event | None:
    for e in events:
        if e.kind == what and e.time >= after and all(e.data.get(k) == v for k, v in match.items()):
            return e
    return None


READY = "INFO ready:"  # the worker's line once it is ready for its first task


def first_log_line(text: str, after: float, containing: str = "") -> float | None:
    """When the process wrote its first log line (our logging's, to the ms) after `after`,
    or its first containing `containing` ("INFO ready:": Trainer.prepare's end)."""
    times = []
    for line in text.splitlines():
        if containing in line and (m := LOG_TIME.match(line)):
            t = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t >= after:
                times.append(t)
    return min(times) if times else None


def relative(marks: dict[str, float | None], t0: float) -> dict[str, float]:
    """Seconds from t0, in order; marks never reached left out."""
    known = {k: round(v - t0, 4) for k, v in marks.items() if v is not None}
    return dict(sorted(known.items(), key=lambda kv: kv[1]))


def startup_phases(job, events, sides: Sides, side, t0, returned, first, outputs) -> dict:
    """train() to the first step, and its phases (seconds from right before train())."""
    worker = first.data["worker"]
    marks: dict[str, float | None] = {"train() returned": t0 + returned}
    running = first_event(events, "job_state", state="running")
    marks["master running (journal)"] = running and running.time
    for role, index in (("ps", 0), ("worker", worker)):
        for kind in ("started", "running"):
            e = first_event(events, "instance", role=role, id=index, kind=kind)
            marks[f"{role} {index} instance {kind} (journal)"] = e and e.time
    logged = first_log_line(outputs[worker], t0)
    marks[f"worker {worker} first log line"] = logged
    imported = tf_imported(outputs[worker], t0)
    marks[f"worker {worker} TensorFlow imported"] = imported and t0 + imported
    marks[f"worker {worker} ready (model built, step traced, run once)"] = first_log_line(
        outputs[worker], t0, READY
    )
    if side == K8S:
        for pod in ("master", "ps-0", f"worker-{worker}"):
            for what, t in sides.timeline.marks(f"{job.name}-{pod}", t0).items():
                if what not in ("deleting", "container terminated", "gone"):
                    marks[f"{pod} pod {what}"] = t
        created = marks.get(f"worker-{worker} pod created")
    else:
        created = marks[f"worker {worker} instance started (journal)"]
    marks[f"first step (worker {worker})"] = first.time
    return {
        "train_to_first_step_s": first.time - t0,
        "worker_created_to_first_step_s": created and first.time - created,
        "worker_created_to_first_log_line_s": created and logged and logged - created,
        "phases_s": relative(marks, t0),
    }


def recovery_phases(events, sides: Sides, side, job, t_kill, victim, new_id, outputs) -> dict:
    """Kill to the replacement's first step, and its phases (seconds from t_kill)."""
    if t_kill is None or new_id is None:
        return {}
    marks: dict[str, float | None] = {}
    ended = next(
        (
            e
            for e in events
            if e.kind == "instance"
            and e.time >= t_kill
            and e.data["role"] == "worker"
            and e.data["id"] == victim
            and e.data["kind"] not in ("started", "running", "pending")
        ),
        None,
    )
    marks[f"victim's end seen by the master ({ended and ended.data['kind']})"] = (
        ended and ended.time
    )
    relaunch = first_event(events, "relaunch", role="worker", replaces=victim)
    marks[f"relaunch (worker {new_id})"] = relaunch and relaunch.time
    started = first_event(events, "instance", role="worker", id=new_id, kind="started")
    marks[f"worker {new_id} instance started (journal)"] = started and started.time
    marks[f"worker {new_id} first log line"] = first_log_line(outputs[new_id], t_kill)
    imported = tf_imported(outputs[new_id], t_kill)
    marks[f"worker {new_id} TensorFlow imported"] = imported and t_kill + imported
    marks[f"worker {new_id} ready (model built, step traced, run once)"] = first_log_line(
        outputs[new_id], t_kill, READY
    )
    if side == K8S:
        marks |= sides.timeline.replacement(
            f"{job.name}-worker-{victim}", f"{job.name}-worker-{new_id}", t_kill
        )
    replacement = first_event(events, "loss", t_kill, worker=new_id)
    marks["replacement's first step"] = replacement and replacement.time
    # A new worker's own start (a promoted standby's was long before the kill).
    created = from_created = None
    if not (relaunch and relaunch.data.get("promoted")):
        created = marks.get("new pod created") if side == K8S else started and started.time
        from_created = created and replacement and replacement.time - created
    return {
        "kill_to_replacement_first_step_s": replacement and replacement.time - t_kill,
        "kill_to_end_seen_s": ended and ended.time - t_kill,
        "replacement_created_to_first_step_s": from_created,
        "new_worker": new_id,
        "phases_s": relative(marks, t_kill),
    }


def ps_recovery_phases(events, sides: Sides, side, job, t_kill, victim, new_id, outputs) -> dict:
    """Kill of the PS to training resumed: the first `loss` event after the relaunched PS
    restored its newest checkpoint (`ps_restored`; the updates after it were rolled back
    and are redone), and its phases (seconds from t_kill)."""
    if t_kill is None:
        return {}
    marks: dict[str, float | None] = {}
    later = [e for e in events if e.time >= t_kill]
    ended = next(
        (
            e
            for e in later
            if e.kind == "instance"
            and e.data["role"] == "ps"
            and e.data["kind"] not in ("started", "running", "pending")
        ),
        None,
    )
    marks[f"PS's end seen by the master ({ended and ended.data['kind']})"] = ended and ended.time
    relaunch = first_event(later, "relaunch", role="ps")
    marks["relaunch (ps 0)"] = relaunch and relaunch.time
    started = first_event(later, "instance", role="ps", id=victim, kind="started")
    marks["ps 0 instance started (journal)"] = started and started.time
    text = outputs.get("ps", "")  # (both incarnations' log: lines after its start)
    marks["ps 0 first log line"] = first_log_line(text, started.time if started else t_kill)
    imported = tf_imported(text, t_kill)
    marks["ps 0 TensorFlow imported"] = imported and t_kill + imported
    restored = first_event(later, "ps_restored")
    marks["ps 0 checkpoint restored (journal)"] = restored and restored.time
    running = first_event(later, "instance", role="ps", id=victim, kind="running")
    marks["ps 0 instance running (journal)"] = running and running.time
    if side == K8S:
        name = f"{job.name}-ps-{victim}"  # (relaunched under its own name)
        marks |= sides.timeline.replacement(name, name, t_kill)
    resumed = restored and first_event(later, "loss", restored.time)
    marks["training resumed (first loss event)"] = resumed and resumed.time
    return {
        "kill_to_resumed_s": resumed and resumed.time - t_kill,
        "kill_to_end_seen_s": ended and ended.time - t_kill,
        "updates_rolled_back": restored and restored.data.get("updates_rolled_back"),
        "phases_s": relative(marks, t_kill),
    }


def attempt(what: str, fn, *args) -> dict:
    harness.log(what)
    try:
        out = fn(*args)
    except Exception as exc:  # a failed run is a result: recorded, and the run goes on
        harness.log(f"  -> FAILED {type(exc).__name__}: {exc}"[:600])
        return {"error": f"{type(exc).__name__}: {exc}"[:2000], "trace": traceback.format_exc()}
    s, parts = out["startup"], []
    parts.append(f"train() -> first step {s['train_to_first_step_s']:.2f} s")
    if (created := s["worker_created_to_first_step_s"]) is not None:
        parts.append(f"worker created -> first step {created:.2f} s")
    if "steady" in out:
        parts.append(f"{out['steady']['samples_per_s']:,.0f} samples/s")
    if (replaced := out.get("recovery", {}).get("kill_to_replacement_first_step_s")) is not None:
        parts.append(f"kill -> replacement's first step {replaced:.2f} s")
    if (resumed := out.get("recovery", {}).get("kill_to_resumed_s")) is not None:
        parts.append(f"kill -> training resumed {resumed:.2f} s")
    if "applied_twice" in out:
        parts.append(f"ledger: {out['applied_twice']} twice, {out['never_applied']} never")
    harness.log("  -> " + "; ".join(parts))
    return out


# ---------------------------------------------------------------------------- main


def column(runs: list[dict], *path: str) -> list:
    """The value at `path` (keys into each run's nested dicts) of every run that has one."""
    out = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out.append(value)
    return out


def seconds_row(
    runs: dict[str, list[dict]],
    case: str,
    metric: str,
    path: tuple[str, ...],
    note: str,
    limit: float | None = None,
    baseline_label: str = LOCAL_LABEL,
) -> dict:
    """A row of times (lower is better): the node's runs against the local ones."""
    return harness.row(
        case,
        metric,
        column(runs[K8S], *path),
        column(runs[LOCAL], *path),
        unit="s",
        baseline_label=baseline_label,
        higher_is_better=False,
        limit=limit,
        note=note,
    )


def standby_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Kill to the replacement's first step when a standby worker takes the place."""
    return [
        seconds_row(
            runs,
            f"{CASE}: worker pod deleted vs process SIGKILLed, one standby worker",
            "kill to replacement's first step",
            ("recovery", "kill_to_replacement_first_step_s"),
            note="the standby (ready, given no work) takes the place; limit on the node's "
            "slowest run",
            limit=2.5,
            baseline_label=f"{LOCAL_LABEL}, one standby worker",
        )
    ]


def ps_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Kill of the PS to training resumed on the relaunched one."""
    return [
        seconds_row(
            runs,
            f"{CASE}: PS pod deleted vs PS process SIGKILLed",
            "kill to training resumed",
            ("recovery", "kill_to_resumed_s"),
            note=f"the first loss event after the relaunched PS restored its newest checkpoint "
            f"(every {CHECKPOINT_STEPS} updates; the ones after it are redone)",
        )
    ]


def ledger_row(*runs: dict[str, list[dict]]) -> dict:
    """Every fault job's ledger: records applied twice or never (0 each is exactly once)."""

    def faults(side: str) -> list:
        return [
            r["applied_twice"] + r["never_applied"]
            for side_runs in runs
            for r in side_runs[side]
            if "applied_twice" in r
        ]

    return harness.row(
        f"{CASE}: every fault job (worker, standby, PS)",
        "records applied twice or never (PS ledger)",
        faults(K8S),
        faults(LOCAL),
        unit="records",
        baseline_label=LOCAL_LABEL,
        higher_is_better=False,
        limit=0,
        note=f"record_ledger=True; each fault job runs its {FAULT_EPOCHS} epochs to the end",
    )


def build_rows(runs: dict[str, list[dict]], epochs: int, w: workloads.Workload) -> list[dict]:
    def col(side: str, *path: str) -> list:
        return column(runs[side], *path)

    def times(case: str, metric: str, *path: str, note: str, limit: float | None = None):
        return seconds_row(runs, case, metric, path, note, limit)

    deleted = f"{CASE}: worker pod deleted vs worker process SIGKILLed"
    return [
        times(
            VS,
            "train() to first step",
            "startup",
            "train_to_first_step_s",
            note="to the journal time of the first loss event; every counted job",
        ),
        times(
            VS,
            "worker created (pod / process) to first step",
            "startup",
            "worker_created_to_first_step_s",
            note="the worker whose loss event came first: its pod as the watch first saw it / "
            "the master's 'instance started' event of its process",
        ),
        times(
            VS,
            "worker created to its first log line",
            "startup",
            "worker_created_to_first_log_line_s",
            note="the part before the worker's Python runs: pod scheduled, sandbox, "
            "container / process spawned",
        ),
        times(
            deleted,
            "kill to replacement's first step",
            "recovery",
            "kill_to_replacement_first_step_s",
            note="delete_namespaced_pod (default grace) / SIGKILL -> first loss event of the "
            "relaunched worker",
        ),
        times(
            deleted,
            "replacement created (pod / process) to its first step",
            "recovery",
            "replacement_created_to_first_step_s",
            note="the new pod as the watch first saw it / the master's 'instance started' "
            "event of the new process, to its first loss event; in a running job (limit 4 s "
            "on the node's slowest run)",
            limit=4.0,
        ),
        times(
            deleted,
            "kill to the victim's end seen by the master",
            "recovery",
            "kill_to_end_seen_s",
            note="the master's instance event: 'deleted' (container ended after SIGTERM, "
            "seen in the pod's status) / 'killed' (the process's exit)",
        ),
        harness.row(
            VS,
            "samples/s",
            col(K8S, "steady", "samples_per_s"),
            col(LOCAL, "steady", "samples_per_s"),
            unit="samples/s",
            baseline_label=LOCAL_LABEL,
            note=f"steady state from the journal; batch {w.batch}, {epochs} epochs of "
            f"{w.records:,} records",
        ),
    ]


def measure(w: workloads.Workload, quick: bool, workdir: Path) -> tuple[list[dict], dict]:
    reps, epochs = 1 if quick else 2, THROUGHPUT_EPOCHS[quick]
    session = node_session.NodeSession(workdir / "node")
    harness.log("starting the real node (make test-node's programs and images)")
    session.start()
    harness.log(f"real node up: { {k: round(v, 1) for k, v in session.seconds.items()} } s")
    timeline = None
    runs: dict[str, list[dict]] = {LOCAL: [], K8S: []}
    standby_runs: dict[str, list[dict]] = {LOCAL: [], K8S: []}
    ps_runs: dict[str, list[dict]] = {LOCAL: [], K8S: []}
    details: dict[str, Any] = {"node_start_s": dict(session.seconds)}
    try:
        namespace = session.job_namespace()
        shared = workdir / "shared"
        shared.mkdir()
        shared.chmod(0o777)  # hostPath ignores fsGroup: the pods' uid 1000 must write here
        timeline = PodTimeline(session.admin, namespace).start()
        sides = Sides(session, namespace, shared, timeline)
        details["warmup"] = {}
        for side in (LOCAL, K8S):
            what = f"warm-up job, {side} (not counted)"
            details["warmup"][side] = attempt(
                what, throughput_job, w, sides, side, "w", WARMUP_EPOCHS
            )
        for rep in range(reps):
            order = (LOCAL, K8S) if rep % 2 == 0 else (K8S, LOCAL)
            for side in order:
                what = f"repeat {rep + 1}/{reps}: throughput job, {side}"
                out = attempt(what, throughput_job, w, sides, side, str(rep), epochs)
                runs[side].append({"kind": "throughput", **out})
            for side in order:
                what = f"repeat {rep + 1}/{reps}: fault job, {side}"
                out = attempt(what, fault_job, w, sides, side, str(rep), rep % WORKERS)
                runs[side].append({"kind": "fault", **out})
        for rep in range(STANDBY_REPEATS):
            for side in (LOCAL, K8S) if rep % 2 == 0 else (K8S, LOCAL):
                what = f"repeat {rep + 1}/{STANDBY_REPEATS}: fault job with a standby, {side}"
                out = attempt(what, fault_job, w, sides, side, str(rep), rep % WORKERS, 1)
                standby_runs[side].append({"kind": "standby fault", **out})
        for rep in range(PS_REPEATS):
            for side in (LOCAL, K8S) if rep % 2 == 0 else (K8S, LOCAL):
                what = f"repeat {rep + 1}/{PS_REPEATS}: fault job losing the PS, {side}"
                out = attempt(what, fault_job, w, sides, side, str(rep), 0, 0, "ps")
                ps_runs[side].append({"kind": "ps fault", **out})
    finally:
        if timeline is not None:
            timeline.stop()
        for record in job_records.all_jobs():  # no local process may outlive the run
            if record.backend == LOCAL:
                submit.kill_job(record, grace_seconds=2)
        t = time.monotonic()
        undone = session.stop()
        details["node_stop_s"] = time.monotonic() - t
        details["node_not_undone"] = undone
        harness.log(f"real node stopped; not undone: {undone or 'nothing'}")
        every = (runs, standby_runs, ps_runs)
        if any("error" in r for kind in every for side in kind.values() for r in side) or undone:
            kept = Path(tempfile.mkdtemp(prefix="edl-bench-k8s-logs-"))
            shutil.copytree(session.logs, kept, dirs_exist_ok=True)
            details["node_logs"] = str(kept)
            harness.log(f"a run failed: the node's logs are kept in {kept}")
    details["runs"] = runs
    details["standby_runs"] = standby_runs
    details["ps_runs"] = ps_runs
    details["job"] = {
        "model": w.title,
        "records": w.records,
        "batch": w.batch,
        "minibatches_per_task": w.per_task,
        "throughput_epochs": epochs,
        "fault_epochs": FAULT_EPOCHS,
        "workers": WORKERS,
        "ps": PS,
        "pod_resources": small_resources(),
        "steady_before_kill_s": STEADY,
    }
    rows = build_rows(runs, epochs, w) + standby_rows(standby_runs) + ps_rows(ps_runs)
    return rows + [ledger_row(runs, standby_runs, ps_runs)], details


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer epochs")
    args = parser.parse_args()
    command = " ".join([".venv/bin/python bench/kubernetes_node.py", *sys.argv[1:]])
    title = "The digits job on a real Kubernetes node (pods) vs on local processes"
    t0 = time.perf_counter()
    why_not = node_session.unavailable()
    if why_not:
        harness.log(f"skipped: {why_not}")
        harness.write_result("kubernetes_node", title, [], {"skipped": why_not}, command=command)
        return 0
    w = workloads.workloads(args.quick)["digits"]
    workdir = Path(tempfile.mkdtemp(prefix="edl-bench-k8s-"))
    try:
        with harness.job_home():
            rows, details = measure(w, args.quick, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    harness.write_result(
        "kubernetes_node", title, rows, details, command=command, seconds=time.perf_counter() - t0
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
