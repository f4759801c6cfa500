"""The ElasticDL sidebar (labextension/) in a real JupyterLab, in a real headless Chromium:
a notebook starts a job; the sidebar shows it with advancing progress, scales it to 3
workers, shows its goodput and that its master was replaced (SIGKILLed), opens its logs,
inserts `%elasticdl attach NAME` into the notebook, stops it after the confirmation
dialog, and rides out a server that stops answering. A job with a worker range and
the throughput growth policy: the sidebar says what the policy does, as its journal says
it, and nothing once a scale to a fixed count turned the policy off, or the job ended.
And, from a job list the test serves itself (no job runs), a worker range with a pending
worker, the scheduler's reason and training waiting for workers.

The screenshots go to the test's directory; with ELASTICDL_NB_UPDATE_DOCS=1 they also
replace docs/sidebar-running.png and docs/sidebar-stopped.png.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from elasticdl_nb.runtime.master.journal import Event
from elasticdl_nb.sdk.view import JobView
from elasticdl_nb.server.summary import _summary
from elasticdl_nb.vocabulary import FINAL_STATES, EventKind

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
MINUTE = 60_000  # Playwright timeouts are in milliseconds

# The job: the digits classifier, each step slowed to >= 50 ms so that it is still
# running (for minutes) while the test scales, attaches and stops it.
TRAIN_CELL = """\
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import elasticdl_nb as edl

x, y = load_digits(return_X_y=True)
x, y = (x / 16.0).astype("float32"), y.astype("int32")


def custom_model():
    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )


def loss(labels, predictions):
    pause = tf.py_function(lambda: (time.sleep(0.05), 0.0)[1], [], tf.float32)
    crossentropy = keras.losses.sparse_categorical_crossentropy(
        labels, predictions, from_logits=True
    )
    return tf.reduce_mean(crossentropy) + 0.0 * tf.reshape(pause, [])


def optimizer():
    return keras.optimizers.Adam(0.002)


job = edl.train(custom_model, loss=loss, optimizer=optimizer, data=(x, y), workers=1,
                epochs=100, minibatch_size=32, name=JOB_NAME)
print("started", job.name)
"""


def _notebook(job_name: str) -> dict:
    source = TRAIN_CELL.replace("JOB_NAME", repr(job_name))
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": "train", "metadata": {},
             "outputs": [], "source": source.splitlines(keepends=True)},
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                           "name": "python3"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip


def _stop_if_running(lab, name: str) -> None:
    """No job of this test outlives it (the notebook's kernel runs under lab.home)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELASTICDL_NB_HOME", str(lab.home))
        import elasticdl_nb as edl

        for job in edl.jobs():
            if job["name"] == name and job["state"] in ("starting", "running"):
                edl.attach(name).stop()


def _kill_the_master(lab, name: str) -> None:
    """SIGKILL the job's master (its supervisor starts a new one, which takes over)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELASTICDL_NB_HOME", str(lab.home))
        import elasticdl_nb as edl

        master = json.loads((Path(edl.attach(name).dir) / "master.json").read_text())
    os.kill(master["pid"], signal.SIGKILL)


def _progress(row) -> float:
    return float(row.locator(".edl-progress").get_attribute("aria-valuenow"))


def _save_for_docs(shot: Path) -> None:
    assert shot.stat().st_size > 10_000
    if os.environ.get("ELASTICDL_NB_UPDATE_DOCS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(shot, DOCS / shot.name)


def test_the_sidebar_follows_scales_attaches_and_stops_a_job(lab, browser, tmp_path, request):
    name = f"sidebar-{secrets.token_hex(3)}"
    (lab.root / "sidebar_job.ipynb").write_text(json.dumps(_notebook(name)))
    request.addfinalizer(lambda: _stop_if_running(lab, name))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    request.addfinalizer(lambda: page.screenshot(path=str(tmp_path / "last-page.png")))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)

    # A workspace of its own: not the tabs (and dialogs) other tests left open.
    page.goto(f"{lab.url}/lab/workspaces/{name}/tree/sidebar_job.ipynb?reset&token={lab.token}")
    lab.run_all_cells(page)

    # The sidebar, opened from its tab in the left bar, lists the job as it starts.
    page.locator(".jp-SideBar.jp-mod-left li[data-id='elasticdl-nb-sidebar']").click()
    sidebar = page.locator(".edl-sidebar")
    sidebar.wait_for(state="visible", timeout=MINUTE)
    assert sidebar.locator(".edl-sidebar-title").inner_text() == "ElasticDL"
    row = sidebar.locator(f".edl-job[data-job-name='{name}']")
    row.wait_for(timeout=3 * MINUTE)  # the kernel imports TensorFlow and checks a step first
    state = row.locator(".edl-job-state")
    page.wait_for_function(
        """([name]) => {
            const row = document.querySelector(`.edl-job[data-job-name="${name}"]`);
            if (!row) return false;
            const bar = row.querySelector(".edl-progress");
            const done = parseFloat(bar.getAttribute("aria-valuenow"));
            return row.dataset.state === "running" && done > 0;
        }""",
        arg=[name],
        timeout=3 * MINUTE,
    )
    assert state.inner_text() == "running"
    assert row.locator(".edl-job-ps").inner_text() == "1 PS"
    assert re.fullmatch(r"\d+[smh].*", row.locator(".edl-job-age").inner_text())
    workers = row.locator(".edl-job-workers")
    assert (workers.get_attribute("data-live"), workers.get_attribute("data-desired")) == ("1", "1")

    # It updates live: the progress advances without anyone touching the page.
    first = _progress(row)
    page.wait_for_function(
        """([name, first]) => {
            const bar = document.querySelector(`.edl-job[data-job-name="${name}"] .edl-progress`);
            return parseFloat(bar.getAttribute("aria-valuenow")) > first;
        }""",
        arg=[name, first],
        timeout=MINUTE,
    )

    # Scale to 3: + twice (the field shows the target), then Scale; 3 live workers follow.
    assert row.locator("button[data-action='scale-down']").is_enabled()
    row.locator("button[data-action='scale-up']").click()
    row.locator("button[data-action='scale-up']").click()
    assert row.locator("input.edl-workers-input").input_value() == "3"
    row.locator("button[data-action='scale-apply']").click()
    page.wait_for_selector(
        f".edl-job[data-job-name='{name}'] .edl-job-workers[data-desired='3']", timeout=MINUTE
    )
    page.wait_for_selector(
        f".edl-job[data-job-name='{name}'] .edl-job-workers[data-live='3']", timeout=3 * MINUTE
    )
    assert workers.inner_text() == "workers 3/3"
    assert row.locator("input.edl-workers-input").input_value() == "3"
    assert state.inner_text() == "running"

    # The goodput, as the master counts it: nothing lost so far (starting and scaling up
    # are not recovery). Then the master is SIGKILLed: a new one takes the job over, and
    # the row says so; the time without a master lowers the goodput.
    goodput = row.locator(".edl-job-goodput")
    goodput.wait_for(timeout=MINUTE)
    assert goodput.inner_text() == "goodput 100 %"
    assert row.locator(".edl-job-restarts").is_hidden()
    _kill_the_master(lab, name)
    page.wait_for_selector(
        f".edl-job[data-job-name='{name}'] .edl-job-restarts[data-restarts='1']",
        timeout=2 * MINUTE,
    )
    assert row.locator(".edl-job-restarts").inner_text() == "master restarted 1×"
    page.wait_for_function(
        """([name]) => {
            const row = document.querySelector(`.edl-job[data-job-name="${name}"]`);
            const goodput = row.querySelector(".edl-job-goodput");
            return row.dataset.state === "running" && goodput
                && parseFloat(goodput.dataset.goodput) < 1;
        }""",
        arg=[name],
        timeout=MINUTE,
    )
    assert re.fullmatch(r"goodput \d+(\.\d)? %", goodput.inner_text()), goodput.inner_text()
    assert goodput.inner_text() != "goodput 100 %"

    # "Attach": a code cell `%elasticdl attach NAME` below the active cell of the notebook.
    row.locator("button[data-action='attach']").click()
    cells = page.locator(".jp-Notebook .jp-Cell")
    page.wait_for_function(
        """([name]) => [...document.querySelectorAll(".jp-Notebook .jp-Cell")]
            .some(c => c.innerText.includes(`%elasticdl attach ${name}`))""",
        arg=[name],
        timeout=MINUTE,
    )
    assert cells.count() == 2
    inserted = cells.nth(1)
    assert "jp-CodeCell" in inserted.get_attribute("class")
    assert inserted.locator(".jp-InputArea-editor").inner_text().splitlines() == [
        "%load_ext elasticdl_nb",  # the notebook had not loaded the magics
        f"%elasticdl attach {name}",
    ]

    # Logs: the master's log in a main-area tab, then a worker's.
    row.locator("button[data-action='logs']").click()
    logs = page.locator(f".edl-logs[data-job-name='{name}']")
    logs.wait_for(timeout=MINUTE)
    page.wait_for_function(
        """([name]) => {
            const pre = document.querySelector(`.edl-logs[data-job-name="${name}"] .edl-logs-text`);
            return pre && pre.textContent.trim().length > 0;
        }""",
        arg=[name],
        timeout=MINUTE,
    )
    assert logs.locator(".edl-logs-role").input_value() == "master"
    master_log = logs.locator(".edl-logs-text").inner_text()
    logs.locator(".edl-logs-role").select_option("worker")
    page.wait_for_function(
        """([name, before]) => {
            const pre = document.querySelector(`.edl-logs[data-job-name="${name}"] .edl-logs-text`);
            return pre.textContent.trim().length > 0 && pre.textContent !== before;
        }""",
        arg=[name, master_log],
        timeout=MINUTE,
    )
    assert state.inner_text() == "running"
    page.locator(".Toastify__toast").first.wait_for(state="detached", timeout=MINUTE)
    shot = tmp_path / "sidebar-running.png"
    page.screenshot(path=str(shot))
    _save_for_docs(shot)
    tab = page.locator(f"li.lm-TabBar-tab[data-id='elasticdl-nb-logs-{name}']")
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    logs.wait_for(state="detached", timeout=MINUTE)

    # Stop: a confirmation dialog first; cancelling it changes nothing.
    row.locator("button[data-action='stop']").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=MINUTE)
    assert f"Stop {name}?" in dialog.inner_text()
    dialog.locator(".jp-mod-reject").click()
    dialog.wait_for(state="detached", timeout=MINUTE)
    assert state.inner_text() == "running"
    row.locator("button[data-action='stop']").click()
    dialog.wait_for(timeout=MINUTE)
    with page.expect_response(lambda r: r.request.method == "DELETE", timeout=2 * MINUTE):
        dialog.locator(".jp-mod-accept").click()  # the reply comes once the job has stopped
    page.wait_for_selector(
        f".edl-job[data-job-name='{name}'][data-state='stopped']:not(.edl-busy)", timeout=MINUTE
    )
    assert state.inner_text() == "stopped"
    for action in ("scale-up", "scale-apply", "stop"):
        assert row.locator(f"button[data-action='{action}']").is_disabled()
    assert row.locator("button[data-action='logs']").is_enabled()

    page.locator(".Toastify__toast").first.wait_for(state="detached", timeout=MINUTE)
    shot = tmp_path / "sidebar-stopped.png"
    page.screenshot(path=str(shot))
    _save_for_docs(shot)

    # The server stops answering: one quiet line, no dialog or toast, the refreshes back
    # off (2 s apart normally: then 4, 8...), and once it answers again all is current.
    def api_request(request) -> bool:
        return "/elasticdl/api/jobs" in request.url

    refused: list[float] = []  # when the sidebar's requests failed, from now on
    page.on("requestfailed", lambda r: refused.append(time.monotonic()) if api_request(r) else None)
    page.route("**/elasticdl/api/jobs*", lambda route: route.abort("connectionrefused"))
    status = sidebar.locator(".edl-status")
    status.wait_for(state="visible", timeout=MINUTE)
    assert status.inner_text() == "Server unreachable, retrying…"
    assert row.is_visible() and state.inner_text() == "stopped"  # the last known list stays
    while len(refused) < 3:  # the first refused refresh, and two more
        with page.expect_event("requestfailed", api_request, timeout=MINUTE):
            pass
    gaps = [round(b - a, 1) for a, b in zip(refused, refused[1:])]
    assert gaps[0] >= 3.5 and gaps[1] >= 7, f"no back-off: {gaps} s between refreshes"
    assert sidebar.locator(".edl-status").count() == 1
    assert page.locator(".jp-Dialog").count() == 0
    assert page.locator(".Toastify__toast").count() == 0
    page.unroute("**/elasticdl/api/jobs*")
    status.wait_for(state="hidden", timeout=MINUTE)
    assert state.inner_text() == "stopped"

    assert not errors, errors
    unexpected = [m for m in console if "elasticdl" in m.lower() and "Failed to load" not in m]
    assert not unexpected, unexpected


# A job whose worker range grows by the throughput policy: the digits job of the
# integration tests, its steps paced to 50 ms, started from a process of its own (the
# local backend's job outlives it) as a script would start it.
GROWING_JOB = """\
from tests.integration.models import digits_job, paced_loss

digits_job(name=NAME, workers="1:2", scale_policy="throughput", epochs=400,
           loss=paced_loss, evaluate=False)
"""


def _growth_reasons(job) -> list[str]:
    """What the job's throughput policy said, oldest first, as its journal says it."""
    return [e.data["reason"] for e in job.events(follow=False) if e.kind == EventKind.GROWTH]


def test_the_sidebar_shows_what_the_throughput_policy_does(
    lab, browser, tmp_path, request, monkeypatch
):
    name = f"growth-{secrets.token_hex(3)}"
    monkeypatch.setenv("ELASTICDL_NB_HOME", str(lab.home))  # (this process's SDK calls)
    request.addfinalizer(lambda: _stop_if_running(lab, name))
    subprocess.run(
        [sys.executable, "-c", GROWING_JOB.replace("NAME", repr(name))],
        cwd=REPO, env={**os.environ, "ELASTICDL_NB_HOME": str(lab.home)},
        check=True, timeout=240,
    )  # fmt: skip
    import elasticdl_nb as edl

    job = edl.attach(name)

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    request.addfinalizer(page.close)
    request.addfinalizer(lambda: page.screenshot(path=str(tmp_path / "last-page.png")))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{lab.url}/lab/workspaces/{name}?reset&token={lab.token}")
    page.locator(".jp-SideBar.jp-mod-left li[data-id='elasticdl-nb-sidebar']").click(
        timeout=3 * MINUTE
    )
    selector = f".edl-job[data-job-name='{name}']"
    row = page.locator(selector)
    page.wait_for_selector(f"{selector}[data-state='running']", timeout=MINUTE)
    growth = row.locator(".edl-job-growth")
    assert growth.get_attribute("role") == "status"

    # The policy starts at the range's MIN, then measures: the line says what it said
    # last, in its own words, as the server read them from the journal.
    growth.wait_for(state="visible", timeout=MINUTE)
    shown = growth.inner_text()
    reasons = _growth_reasons(job)
    assert reasons[0] == "starting at MIN: 1"
    assert shown in [f"throughput policy: {reason}" for reason in reasons], (shown, reasons)
    assert row.locator(".edl-job-workers").get_attribute("data-min") == "1"

    # A fixed count turns the policy off: the line goes.
    job.scale(1)
    page.wait_for_selector(
        f"{selector} .edl-job-workers[data-min='0'][data-desired='1'][data-live='1']",
        timeout=2 * MINUTE,
    )
    growth.wait_for(state="hidden", timeout=MINUTE)
    assert growth.text_content() == ""

    # A range again: the policy starts over from the workers that run, and says so.
    job.scale("1:2")
    page.wait_for_function(
        """([name]) => {
            const row = document.querySelector(`.edl-job[data-job-name="${name}"]`);
            const line = row.querySelector(".edl-job-growth");
            return !line.hidden && line.textContent.includes("a new range 1:2");
        }""",
        arg=[name],
        timeout=MINUTE,
    )
    shown = growth.inner_text()
    assert re.fullmatch(r"throughput policy: a new range 1:2: measuring again from [12]", shown)
    assert shown.removeprefix("throughput policy: ") in _growth_reasons(job)
    page.screenshot(path=str(tmp_path / "sidebar-growth.png"))

    # The job ends while the policy runs: nothing about it is shown any more.
    assert job.stop()["state"] == "stopped"
    page.wait_for_selector(f"{selector}[data-state='stopped']", timeout=MINUTE)
    assert growth.is_hidden() and growth.text_content() == ""
    assert not errors, errors


UNSCHEDULABLE = "unschedulable: 0/1 nodes are available: 1 Insufficient cpu."


def _served_summary(name: str, workers: int, min_workers: int, events: list) -> dict:
    """What the server's list says of a running job whose journal holds `events`: its
    summary as elasticdl_nb/server/summary.py makes it, from a view of those events."""
    view = JobView(name, backend="kubernetes", workers=workers, min_workers=min_workers)
    for seq, (kind, data) in enumerate(events):
        view.apply(Event(seq, 1000.0 + seq, kind, data))
    job = SimpleNamespace(name=name, backend="kubernetes", created=time.time() - 300)
    return _summary(job, {"state": "running"}, view)


def test_the_sidebar_shows_a_worker_range_pending_workers_and_why_training_waits(
    lab, browser, tmp_path, request
):
    """No job runs: the test serves the job list itself, from views of made-up journals."""
    ranged = f"range-{secrets.token_hex(3)}"
    waiting = [
        ("instance", {"role": "worker", "id": 0, "kind": "running"}),
        ("instance", {"role": "worker", "id": 1, "kind": "pending", "reason": UNSCHEDULABLE}),
        ("worker_floor", {"running": 1, "min": 2, "below": True, "held": True}),
    ]
    running = [("instance", {"role": "worker", "id": i, "kind": "running"}) for i in range(3)]
    listed = {
        "jobs": [
            _served_summary(ranged, 4, 2, waiting),
            _served_summary("fixed", 3, 0, running),
        ],
        "final_states": sorted(FINAL_STATES),
    }
    assert listed["jobs"][0]["workers"]["pending_reason"] == UNSCHEDULABLE  # (the server's)

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    request.addfinalizer(page.close)
    request.addfinalizer(lambda: page.screenshot(path=str(tmp_path / "last-page.png")))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.route(
        "**/elasticdl/api/jobs*",
        lambda route: (
            route.fulfill(json=listed) if route.request.method == "GET" else route.abort("failed")
        ),
    )
    page.goto(f"{lab.url}/lab/workspaces/{ranged}?reset&token={lab.token}")
    page.locator(".jp-SideBar.jp-mod-left li[data-id='elasticdl-nb-sidebar']").click(
        timeout=3 * MINUTE
    )
    row = page.locator(f".edl-job[data-job-name='{ranged}']")
    row.wait_for(timeout=MINUTE)

    # The range, one pending worker and why (the scheduler's words, as text and as the
    # count's tooltip), and that training waits for workers, as a warning line.
    workers = row.locator(".edl-job-workers")
    assert workers.inner_text() == "workers 1/4 (2:4)"
    assert (workers.get_attribute("data-min"), workers.get_attribute("data-desired")) == ("2", "4")
    pending = row.locator(".edl-job-pending")
    assert pending.inner_text() == "1 pending" and pending.get_attribute("data-pending") == "1"
    assert UNSCHEDULABLE in pending.get_attribute("title")
    reason = row.locator(".edl-job-pending-reason")
    assert reason.is_visible() and reason.inner_text() == f"pending: {UNSCHEDULABLE}"
    warning = row.locator(".edl-job-workers-waiting")
    assert warning.is_visible()
    assert warning.inner_text() == "1 of at least 2 workers running: training waits"
    assert UNSCHEDULABLE in row.inner_text()

    # A fixed number of workers, all running: no range, nothing pending, no warning.
    fixed = page.locator(".edl-job[data-job-name='fixed']")
    assert fixed.locator(".edl-job-workers").inner_text() == "workers 3/3"
    assert fixed.locator(".edl-job-workers").get_attribute("data-min") == "0"
    assert fixed.locator(".edl-job-pending").is_hidden()
    assert fixed.locator(".edl-job-pending-reason").is_hidden()
    assert fixed.locator(".edl-job-workers-waiting").is_hidden()

    # The pending worker starts: the next refresh drops the reason and the warning.
    listed["jobs"][0] = _served_summary(
        ranged,
        4,
        2,
        [
            *waiting,
            ("instance", {"role": "worker", "id": 1, "kind": "running"}),
            ("worker_floor", {"running": 2, "min": 2, "below": False, "held": False}),
        ],
    )
    page.wait_for_selector(
        f".edl-job[data-job-name='{ranged}'] .edl-job-workers[data-live='2']", timeout=MINUTE
    )
    assert workers.inner_text() == "workers 2/4 (2:4)"
    assert pending.is_hidden() and reason.is_hidden() and warning.is_hidden()
    page.screenshot(path=str(tmp_path / "sidebar-range.png"))
    assert not errors, errors
