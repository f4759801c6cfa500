"""Goodput and stragglers with real processes (issue 16, "Seen live"): a run without
faults has goodput 1.0 and flags nobody; a SIGKILLed worker lowers the goodput by the time
its slot took to train again, a SIGKILLed master by its downtime (for every slot), as the
new master reports it and the journal gives it; a worker slowed from outside (SIGSTOP 75 %
of the time) is flagged a straggler within 30 s, and nobody else is. The dashboard and the
text progress show the same figures as the master."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from elasticdl_nb.runtime.master.goodput import Goodput
from elasticdl_nb.runtime.master.journal import read_journal_file
from elasticdl_nb.sdk.progress import ProgressPrinter
from elasticdl_nb.sdk.view.text import format_goodput, format_percent
from tests.integration.dashboards import rendered_dashboard
from tests.integration.faults import fault_rng, pid_of, wait_for, wait_for_step
from tests.integration.models import digits_job, paced_loss

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 1400 // 32 + 1


def _events(job, kind: str) -> list:
    return [e for e in job.events(follow=False) if e.kind == kind]


def _text_progress(job) -> str:
    out = io.StringIO()
    printer = ProgressPrinter(job.name, out, every_seconds=0)
    for event in job.events(follow=False):
        printer.show(event)
    return out.getvalue()


def test_a_run_without_faults_has_goodput_one_and_no_straggler(job_home):
    job, _, _ = digits_job(workers=3, epochs=30, loss=paced_loss)
    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")
    assert final["goodput"] == 1.0 and final["recovering_s"] == 0.0
    assert final["training_s"] > 3 * 10, final  # three workers, more than 10 s of training
    progress = _events(job, "progress")
    assert progress and all(e.data["goodput"] == 1.0 for e in progress)
    took = [e.data for e in _events(job, "worker_time")]
    print(f"{len(took)} training tasks, {final['training_s']} worker-s, nobody flagged")
    assert _events(job, "straggler") == [] and final["stragglers"] == []
    header, _ = rendered_dashboard(job)
    assert "goodput 100 %" in header


def test_a_sigkilled_worker_lowers_the_goodput_by_its_slot_s_recovery(job_home):
    rng = fault_rng("goodput-worker-kill")
    epochs = 20
    job, _, _ = digits_job(workers=3, epochs=epochs, loss=paced_loss)
    victim = rng.randrange(3)
    status = wait_for_step(job, rng.randint(20, epochs * STEPS_PER_EPOCH // 3))
    os.kill(pid_of(status, "worker", victim), signal.SIGKILL)
    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")

    # The recovery, read back from the journal: the victim's end to its replacement's
    # first applied minibatch.
    events = list(job.events(follow=False))
    killed = next(
        e for e in events if e.kind == "instance" and e.data["id"] == victim
        and e.data["role"] == "worker" and e.data["kind"] == "killed"
    )  # fmt: skip
    replacement = next(e.data["id"] for e in events if e.kind == "relaunch")
    trained = next(
        e for e in events if e.kind == "queue" and e.data["op"] == "report"
        and e.data.get("worker") == replacement and e.data["starts"]
    )  # fmt: skip
    recovery = trained.time - killed.time
    print(
        f"worker {victim} killed at step {status['step']}: its replacement trained "
        f"{recovery:.1f} s later; goodput {final['goodput']} "
        f"({final['recovering_s']} of {final['training_s'] + final['recovering_s']} worker-s)"
    )
    assert final["recovering_s"] == pytest.approx(recovery, abs=0.1)
    assert recovery > 0.2  # a forked replacement (TensorFlow imported) builds and traces its step
    wanted = final["training_s"] + final["recovering_s"]
    assert final["goodput"] == pytest.approx(1 - final["recovering_s"] / wanted, abs=1e-3)
    assert 0.5 < final["goodput"] < 1.0
    # The same number everywhere: the job's last event, the dashboard, the text.
    end = [e for e in events if e.kind == "job_state"][-1]
    assert end.data["state"] == "succeeded" and end.data["goodput"] == final["goodput"]
    header, _ = rendered_dashboard(job)
    assert f"goodput {format_percent(final['goodput'])}" in header
    # The end line carries the final figure; a progress line may be seconds older.
    text = _text_progress(job)
    assert " | workers 3/3" in text
    ending = f"succeeded: all epochs done ({format_goodput(final['goodput'])})"
    assert text.splitlines()[-1].endswith(ending)


class SlowDown:
    """Stops a process `stopped` of every `period` seconds (SIGSTOP, SIGCONT) until
    `stop()`."""

    def __init__(self, pid: int, period: float = 0.4, stopped: float = 0.75):
        self.pid, self.period, self.stopped = pid, period, stopped
        self._done = threading.Event()
        self.started = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self._done.wait(self.period * self.stopped)
                os.kill(self.pid, signal.SIGCONT)
                self._done.wait(self.period * (1 - self.stopped))
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("strategy", ["ps", "allreduce"])
def test_a_worker_slowed_from_outside_is_flagged_a_straggler_within_30_s(job_home, strategy):
    rng = fault_rng(f"straggler-{strategy}")
    job, _, _ = digits_job(
        workers=3, epochs=200, loss=paced_loss, strategy=strategy, evaluate=False
    )
    victim = rng.randrange(3)
    status = wait_for_step(job, rng.randint(40, 120))
    slow = SlowDown(pid_of(status, "worker", victim))
    try:
        flag = wait_for(lambda: _events(job, "straggler"), 60, "a straggler event", 0.5)[0]
        took = flag.time - slow.started
        print(f"{strategy}: worker {victim} slowed at step {status['step']}: flagged "
              f"{took:.1f} s later: {flag.data}")  # fmt: skip
        assert flag.data["worker"] == victim and flag.data["ratio"] > 2
        assert took <= 30
        assert job.status()["stragglers"] == [flag.data]
        time.sleep(10)  # and nobody else, while it stays slow
    finally:
        slow.stop()
    print(f"slowed for {time.time() - slow.started:.1f} s")
    assert [e.data["worker"] for e in _events(job, "straggler")] == [victim]
    # The text progress names it, in one line with the goodput and the workers.
    line = next(line for line in _text_progress(job).splitlines() if "straggler: worker" in line)
    assert f"straggler: worker {victim} (" in line and "| goodput " in line
    assert "| workers 3/3 |" in line
    # Caught up again: cleared.
    cleared = wait_for(lambda: _events(job, "straggler_cleared"), 60, "the straggler cleared")
    assert cleared[0].data["worker"] == victim and cleared[0].data["reason"] == "caught up"
    print(f"cleared {cleared[0].time - slow.started:.1f} s after the slowdown began")
    job.stop()
    _, details = rendered_dashboard(job)
    assert f"worker {victim} is a straggler" in details
    assert f"worker {victim} is no longer a straggler (caught up)" in details


def test_a_new_master_reports_the_goodput_the_journal_gives_with_its_downtime(job_home):
    job, _, _ = digits_job(workers=2, epochs=12, loss=paced_loss)
    wait_for_step(job, 60)
    old = json.loads((Path(job.dir) / "master.json").read_text())["pid"]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: job.status().get("master_restarts") == 1, 60, "a new master")
    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final.get("error")

    events = list(read_journal_file(Path(job.dir) / "events.jsonl"))
    [restarted] = [e for e in events if e.kind == "master_restarted"]
    down = restarted.time - events[restarted.data["continued"] - 1].time
    print(f"master down {down:.1f} s: goodput {final['goodput']} ({final['recovering_s']} "
          f"of {final['training_s'] + final['recovering_s']} worker-s recovering)")  # fmt: skip
    assert final["recovering_s"] == pytest.approx(2 * down, abs=0.1)  # both slots
    # The figures the new master reported are the journal's, folded from scratch.
    assert Goodput(_AsWritten(events), 2).fields() == {
        k: final[k] for k in ("goodput", "training_s", "recovering_s")
    }


class _AsWritten:
    """The journal file's events, as `Goodput` reads a journal."""

    def __init__(self, events):
        self.events = events

    def read(self, from_seq=0, follow=False):
        return iter(self.events[from_seq:])
