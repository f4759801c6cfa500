"""Widget path: what the live dashboard costs the kernel and the front end at 10k events/s.

    .venv/bin/python bench/widget_path.py            # full run (~2 min)
    .venv/bin/python bench/widget_path.py --quick    # one short repeat (~25 s)

Issue target: the messages the dashboard sends to the front end stay at about 4 a second
or fewer, however fast the job's events come.

Every run starts a real IPython kernel (jupyter_client's KernelManager, this venv's
python, kernel spec "python3") and executes one cell in it that defines a synthetic job —
`events()` yields 10,000 events a second on an absolute schedule (event i due at
start + i / rate): a `loss` event of one point each, a `progress` event every 10th, an
evaluation every 10,000th, a worker killed and relaunched every 20,000th — then builds
one of the dashboards below over it and displays it. What is measured is the widget path
in the kernel, not the master or the network (bench/event_path.py measures those).

ours      `elasticdl_nb.widgets.Dashboard(job)`: a reader thread folds events into the
          JobView; a render thread pushes the changed widgets at most every 0.5 s (the
          curves, the table and the log at most every 1 s).
naive     the same JobView (so the same bounded loss curve) and the same widgets' content,
          but every widget is set after every event, on the reader thread: status HTML,
          an IntProgress, the table-and-log HTML, and a stock plotly FigureWidget's loss
          trace (x then y, no batch_update, no throttle).
feed      the synthetic job consumed into a JobView with no widgets at all: the cost of
          the feed itself, for reading the CPU figures (details only).

The client subscribes to the kernel's iopub socket with a plain ZMQ SUB socket and reads
raw frames (header only, so that it keeps up with the naive dashboard) and counts the
messages a front end would receive — comm_open, comm_msg, stream, display_data — in a
window of 10 s (4 s with --quick) that starts once the cell's outputs are all out (its
`idle` status has arrived on iopub: the widgets are built and displayed, the feed runs),
and their bytes. The kernel's CPU share is its user + system
time from /proc/<pid>/stat over the same window (1.0 = one core). Renders are
timestamped in the kernel (ours: render passes that sent something; naive: one per event).
Events handled / events due by the end of the window: whether the dashboard keeps up.
Runs alternate ours / naive / feed, each in a fresh kernel.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import zmq
from harness import ROOT, log, row, write_result
from jupyter_client import KernelManager

NAME = "widget_path"
CASE = "live dashboard in an ipykernel, synthetic job at 10k events/s"
RATE = 10_000.0
LIMIT_MESSAGES = 4.0
FRONT_END_TYPES = ("comm_open", "comm_msg", "stream", "display_data")

# The cell each run executes in the kernel; MODE, RATE and FEED_SECONDS are prepended.
KERNEL_CODE = r'''
import json, pathlib, tempfile, threading, time

from IPython.display import display

from elasticdl_nb.runtime.master.journal import Event
from elasticdl_nb.sdk.view import JobView


class SyntheticJob:
    """What Dashboard needs of a Job, with events made up at RATE per second."""

    name = "bench-widgets"

    def __init__(self, rate, seconds):
        self.rate, self.seconds = rate, seconds
        self.dir = pathlib.Path(tempfile.mkdtemp())
        spec = {"backend": "local", "epochs": 3, "workers": 2, "ps": 1}
        (self.dir / "spec.json").write_text(json.dumps(spec))
        self.stopped = threading.Event()
        self.started = None  # when the schedule began (time.time())
        self.reached = 0  # scheduled events produced so far: the reader asked for them
        self.per_epoch = int(rate * seconds) * 32 // 3

    def _made_up(self, i):
        if i % 20000 == 19999:
            return [("instance", dict(role="worker", id=0, kind="killed", signal="SIGKILL",
                                      reason="killed by SIGKILL", expected=False)),
                    ("relaunch", dict(role="worker", id=0, replaces=0, reason="killed")),
                    ("instance", dict(role="worker", id=0, kind="started", pid=100 + i))]
        if i % 10000 == 9999:
            return [("evaluation", dict(round=i, step=i, metrics={"accuracy": i / 1e6},
                                        final=False))]
        if i % 10 == 9:
            return [("progress", dict(epoch=0, epochs=3, step=i, records_done=32 * i,
                                      records_per_epoch=self.per_epoch,
                                      records_per_second=32 * self.rate))]
        return [("loss", dict(worker=i % 2, points=[[i + 1, 1.0 / (1 + i / 1000)]]))]

    def events(self, from_seq=0, follow=True, timeout=None):
        seq = 0

        def event(kind, data):
            nonlocal seq
            seq += 1
            return Event(seq - 1, time.time(), kind, data)

        yield event("job_state", dict(state="running", reason="started", epoch=0, epochs=3,
                                      step=0, records_done=0, records_per_epoch=self.per_epoch,
                                      records_per_second=0.0))
        for role, n in (("ps", 1), ("worker", 2)):
            for k in range(n):
                yield event("instance", dict(role=role, id=k, kind="started", pid=10 + k))
        yield event("epoch", dict(epoch=0, tasks=1000))
        start, self.started = time.perf_counter(), time.time()
        for i in range(int(self.rate * self.seconds)):
            if self.stopped.is_set():
                break
            wait = start + i / self.rate - time.perf_counter()
            if wait > 0.001:
                time.sleep(wait)
            for kind, data in self._made_up(i):
                yield event(kind, data)
            self.reached = i + 1
        yield event("job_state", dict(state="stopped", reason="benchmark done"))

    def scale(self, workers):
        return {"workers_from": 2, "workers_to": workers}

    def stop(self):
        self.stopped.set()
        return {"state": "stopped"}


job = SyntheticJob(RATE, FEED_SECONDS)
render_times = []

# Every comm message the kernel publishes, timestamped: checks that the client's count
# (which ZMQ could undercount by dropping at the PUB socket's high-water mark) is complete.
import ipykernel.comm.comm as _kernel_comm

published = []
_publish = _kernel_comm.BaseComm.publish_msg


def _counted_publish(self, msg_type, *args, **kwargs):
    published.append(time.time())
    return _publish(self, msg_type, *args, **kwargs)


_kernel_comm.BaseComm.publish_msg = _counted_publish

if MODE == "ours":
    from elasticdl_nb.widgets.dashboard import Dashboard

    dash = Dashboard(job, start=False)
    render = dash.render

    def timed_render(final=False):
        sent = render(final)
        if sent:
            render_times.append(time.time())
        return sent

    dash.render = timed_render
    display(dash)
    dash.start()
    view = dash.view

elif MODE == "naive":
    import ipywidgets as W
    import plotly.graph_objects as go

    from elasticdl_nb.widgets.dashboard_html import details_html, status_html

    view = JobView.for_job(job)
    status, details = W.HTML(), W.HTML()
    bar = W.IntProgress(min=0, max=1000)
    figure = go.FigureWidget(data=[go.Scatter(x=[], y=[], mode="lines", name="loss")])
    display(W.VBox([status, bar, figure, details]))

    def naive_follow():
        for event in job.events():
            view.apply(event)
            status.value = status_html(view, time.time())
            total = view.records_total()
            bar.value = int(1000 * view.records_done() / total) % 1001 if total else 0
            details.value = details_html(view)
            xs, ys = view.loss.xy()
            figure.data[0].x = xs
            figure.data[0].y = ys
            render_times.append(time.time())

    threading.Thread(target=naive_follow, daemon=True).start()

else:  # the feed alone, into a JobView, no widgets
    view = JobView.for_job(job)

    def feed_only():
        for event in job.events():
            view.apply(event)

    threading.Thread(target=feed_only, daemon=True).start()
'''

# Read right after the window (user_expressions of a second, tiny execute).
# The generator makes an event only when the reader asks for the next one, so a reader
# that falls behind shows as `reached` (scheduled events produced) < `due` (scheduled
# events whose time has come).
REPORT = (
    "json.dumps({'reached': job.reached, "
    "'due': min(int(job.rate * job.seconds), int((time.time() - job.started) * job.rate)), "
    "'render_times': render_times, 'published': published})"
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class IopubCounter:
    """Every iopub message of a kernel: (arrival time, msg_type, bytes), raw frames."""

    def __init__(self, km: KernelManager):
        self.messages: list[tuple[float, str, int]] = []
        self.idle_after: set[str] = set()  # msg_ids of requests whose outputs are all out
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(f"{km.transport}://{km.ip}:{km.iopub_port}")
        self._running = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while self._running:
            if not poller.poll(100):
                continue
            frames = self._sub.recv_multipart(copy=True)
            now = time.time()
            i = frames.index(b"<IDS|MSG>")
            header = json.loads(frames[i + 2])
            self.messages.append((now, header["msg_type"], sum(len(f) for f in frames)))
            if header["msg_type"] == "status" and b"idle" in frames[i + 5]:
                self.idle_after.add(json.loads(frames[i + 3]).get("msg_id"))

    def wait_connected(self, kc: Any, timeout: float) -> None:
        """Until this subscriber hears the kernel. A SUB socket joins its publisher some
        time after `connect` (and retries while the kernel is still binding it); what is
        published before then is not delivered, so a quick cell's `idle` could be missed.
        Asks for kernel_info until the `idle` of one of the requests arrives here."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg_id = kc.kernel_info()
            try:
                self.wait_idle(msg_id, timeout=0.5)
                return
            except TimeoutError:
                continue
        raise TimeoutError(f"the kernel's iopub did not reach this subscriber in {timeout:g} s")

    def wait_idle(self, msg_id: str, timeout: float) -> None:
        """Until the kernel's `idle` for a request has arrived: its outputs come on iopub
        and may arrive after its reply on the shell socket."""
        deadline = time.monotonic() + timeout
        while msg_id not in self.idle_after:
            if time.monotonic() > deadline:
                raise TimeoutError("no idle status on iopub")
            time.sleep(0.01)

    def close(self) -> None:
        self._running = False
        self._thread.join(2)
        self._sub.close(0)
        self._ctx.term()

    def between(self, t0: float, t1: float) -> list[tuple[float, str, int]]:
        return [m for m in self.messages if t0 <= m[0] < t1]


def execute(kc: Any, code: str, timeout: float, expressions: dict | None = None) -> tuple:
    msg_id = kc.execute(code, silent=False, store_history=False,
                        user_expressions=expressions or {})  # fmt: skip
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    content = reply["content"]
    if content["status"] != "ok":
        raise RuntimeError(f"kernel cell failed: {content.get('ename')}: {content.get('evalue')}")
    return msg_id, content


def measure(mode: str, seconds: float) -> dict[str, Any]:
    """One run in a fresh kernel: set up `mode`, count iopub and CPU over the window."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(ROOT))
    kc = km.client()
    kc.start_channels(iopub=False, stdin=False, hb=False)
    counter = IopubCounter(km)
    try:
        kc.wait_for_ready(timeout=60)
        counter.wait_connected(kc, timeout=60)
        pid = km.provisioner.process.pid
        code = f"MODE = {mode!r}\nRATE = {RATE}\nFEED_SECONDS = {seconds + 2.0}\n" + KERNEL_CODE
        msg_id, _ = execute(kc, code, timeout=120)
        counter.wait_idle(msg_id, timeout=30)  # the widgets are built and displayed
        t0, cpu0 = time.time(), cpu_seconds(pid)
        time.sleep(seconds)
        t1, cpu1 = time.time(), cpu_seconds(pid)
        _, reply = execute(kc, "job.stop()", timeout=60, expressions={"r": REPORT})
        text = reply["user_expressions"]["r"]["data"]["text/plain"]  # the repr of a str
        report = json.loads(ast.literal_eval(text))
        setup = counter.between(0, t0)
    finally:
        counter.close()
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    window = counter.between(t0, t1)
    kinds = Counter(kind for _, kind, _ in window)
    front_end = [m for m in window if m[1] in FRONT_END_TYPES]
    span = t1 - t0
    renders = sum(1 for t in report["render_times"] if t0 <= t < t1)
    published = sum(1 for t in report["published"] if t0 <= t < t1)
    return {
        "mode": mode,
        "seconds": round(span, 3),
        "front_end_messages_per_s": len(front_end) / span,
        "comm_msgs_per_s": kinds["comm_msg"] / span,
        "kernel_comm_msgs_per_s": published / span,
        "front_end_kib_per_s": sum(m[2] for m in front_end) / span / 1024,
        "renders_per_s": renders / span,
        "comm_msgs_per_render": kinds["comm_msg"] / renders if renders else None,
        "kernel_cpu_share": (cpu1 - cpu0) / span,
        "handled_share": min(1.0, report["reached"] / max(1, report["due"])),
        "reached": report["reached"],
        "due": report["due"],
        "iopub_by_type": dict(kinds),
        "setup_front_end_messages": sum(1 for m in setup if m[1] in FRONT_END_TYPES),
    }


def summary(run: dict[str, Any]) -> str:
    per_render = run["comm_msgs_per_render"]
    return (
        f"{run['mode']}: {run['front_end_messages_per_s']:.1f} msgs/s to the front end "
        f"({run['front_end_kib_per_s']:.1f} KiB/s), {run['renders_per_s']:.1f} renders/s"
        + (f" ({per_render:.2f} comm msgs each)" if per_render else "")
        + f"; the kernel published {run['kernel_comm_msgs_per_s']:.1f} comm msgs/s"
        + f", kernel CPU {100 * run['kernel_cpu_share']:.0f}%, handled "
        f"{100 * run['handled_share']:.0f}% of the events; iopub {run['iopub_by_type']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repeat")
    args = parser.parse_args()
    began = time.perf_counter()
    repeats, seconds = (1, 4.0) if args.quick else (3, 10.0)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "naive": [], "feed": []}
    for _ in range(repeats):
        for mode in runs:
            runs[mode].append(measure(mode, seconds))
            log(summary(runs[mode][-1]))
    ours, naive, feed = runs["ours"], runs["naive"], runs["feed"]

    def pick(rs: list[dict], key: str) -> list[float]:
        return [r[key] for r in rs]

    feed_cpu = sorted(pick(feed, "kernel_cpu_share"))[len(feed) // 2]
    label = "naive: every widget set on every event"
    rows = [
        row(CASE, "messages to the front end per second", pick(ours, "front_end_messages_per_s"),
            pick(naive, "front_end_messages_per_s"), unit="msgs/s", baseline_label=label,
            higher_is_better=False, limit=LIMIT_MESSAGES,
            note="comm_open + comm_msg + stream + display_data on iopub"),
        row(CASE, "renders per second", pick(ours, "renders_per_s"), pick(naive, "renders_per_s"),
            unit="renders/s", baseline_label=label, higher_is_better=False),
        row(CASE, "data to the front end", pick(ours, "front_end_kib_per_s"),
            pick(naive, "front_end_kib_per_s"), unit="KiB/s", baseline_label=label,
            higher_is_better=False),
        row(CASE, "kernel CPU share", pick(ours, "kernel_cpu_share"),
            pick(naive, "kernel_cpu_share"), unit="cores", baseline_label=label,
            higher_is_better=False,
            note=f"includes the synthetic feed itself: {feed_cpu:.2f} cores with no widgets"),
        row(CASE, "events handled / events due", pick(ours, "handled_share"),
            pick(naive, "handled_share"), baseline_label=label, higher_is_better=True),
    ]  # fmt: skip
    details = {"ours": ours, "naive": naive, "feed_only": feed, "rate": RATE}
    command = ".venv/bin/python bench/widget_path.py" + (" --quick" if args.quick else "")
    total = time.perf_counter() - began
    write_result(NAME, "Live dashboard: widget path", rows, details, command=command,
                 seconds=total)  # fmt: skip
    log(f"done in {total:.1f} s")


if __name__ == "__main__":
    main()
