"""A local job's supervisor, as a real process with a stand-in master
(`supervised_master.py`, which talks through the real `SupervisedProcesses`) and real
worker and PS processes: it restarts a master that dies and hands the new one the
instances that ran on, gives up after its budget, does not restart a master that never
served or one that was stopped, and takes every process of the job with it when killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elasticdl_nb.backends.job_records import SUPERVISOR_MODULE
from elasticdl_nb.backends.local.supervisor import MAX_RESTARTS
from elasticdl_nb.backends.local.warm_pool_link import IDLE_ENV
from elasticdl_nb.runtime.lifeline import PARENT_ENV
from tests.conftest import REPO
from tests.integration.faults import alive, wait_for
from tests.integration.job_process import prepare_job_dir


@pytest.fixture
def supervise(tmp_path):
    """start(plan) -> the supervisor process of a job whose master follows `plan`."""
    started: list[subprocess.Popen] = []
    job_dir = tmp_path / "job"
    prepare_job_dir(job_dir)
    (job_dir / "logs").mkdir()

    def start(plan: dict, env: dict[str, str] | None = None) -> subprocess.Popen:
        (job_dir / "plan.json").write_text(json.dumps(plan))
        with open(job_dir / "logs" / "supervisor.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", SUPERVISOR_MODULE, "--job-dir", str(job_dir)]
                + ["--master-module", "tests.unit.supervised_master"],
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    start.job_dir = job_dir
    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _seen(job_dir: Path) -> list[dict]:
    path = job_dir / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _events(job_dir: Path, incarnation: int) -> list[dict]:
    return [s["event"] for s in _seen(job_dir) if s["incarnation"] == incarnation and "event" in s]


def _started(job_dir: Path, incarnation: int, role: str, instance_id: int) -> int | None:
    for event in _events(job_dir, incarnation):
        if (event["role"], event["instance_id"], event["kind"]) == (role, instance_id, "started"):
            return event["pid"]
    return None


def _log(job_dir: Path) -> str:
    return (job_dir / "logs" / "supervisor.log").read_text()


def test_a_master_that_dies_is_replaced_and_the_new_one_adopts_what_ran_on(supervise):
    job_dir = supervise.job_dir
    supervisor = supervise(
        {
            "0": [
                ["serve"],
                ["launch", "ps", 0],
                ["launch", "worker", 0],
                ["launch", "worker", 1],
                ["wait_started", "ps", 0],
                ["wait_started", "worker", 0],
                ["wait_started", "worker", 1],
                ["kill", "worker", 1, True],  # it ends while no master listens
                ["sigkill"],
            ],
            "1": [
                ["serve"],
                ["adopt"],
                ["kill", "worker", 0, True],
                ["wait_end", "worker", 0],
                ["state", "succeeded"],
                ["exit", 0],
            ],
        }
    )
    assert supervisor.wait(60) == 0, _log(job_dir)
    first = {
        (e["role"], e["instance_id"]): e["pid"]
        for e in _events(job_dir, 0)
        if e["kind"] == "started"
    }
    assert set(first) == {("ps", 0), ("worker", 0), ("worker", 1)}
    for pid in first.values():
        assert not alive(pid)  # the PS too: the job is over

    adopted = [s["adopted"] for s in _seen(job_dir) if "adopted" in s]
    assert adopted == [[["ps", 0], ["worker", 0], ["worker", 1]]]
    after = _events(job_dir, 1)
    # First the state of each, as the new master took it over (same processes), ...
    assert {(e["role"], e["instance_id"]): (e["kind"], e["pid"]) for e in after[:3]} == {
        ("ps", 0): ("started", first[("ps", 0)]),
        ("worker", 0): ("started", first[("worker", 0)]),
        ("worker", 1): ("killed", first[("worker", 1)]),
    }
    # ... then what happened after.
    assert after[3] == {
        "role": "worker",
        "instance_id": 0,
        "kind": "killed",
        "exit_code": None,
        "signal": "SIGKILL",
        "reason": "killed by SIGKILL",
        "pid": first[("worker", 0)],
    }
    log = _log(job_dir)
    assert log.count("restarting it") == 1
    assert "master incarnation 0 (pid" in log and "was killed by SIGKILL" in log
    assert "test-token" not in log  # the environment the master sent is not logged


def _fork_servers(job_dir: Path) -> list[int]:
    """The pids of the job's fork servers that got ready, in order."""
    return [int(pid) for pid in re.findall(r"fork server ready \(pid (\d+)\)", _log(job_dir))]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _lifeline(pid: int) -> bytes:
    """The PARENT_ENV entry a process was started with (a forked process sets its own
    later, which /proc does not show: its parent is what counts there)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((e for e in environ if e.startswith(PARENT_ENV.encode() + b"=")), b"")


def test_the_instances_of_a_job_have_their_lifeline_on_the_supervisor(supervise):
    """(A fork server of the user's warm pool: test_warm_pool.py.)"""
    job_dir = supervise.job_dir
    no_pool = {IDLE_ENV: "0"}
    supervisor = supervise({"0": [["serve"], ["launch", "worker", 0], ["hang"]]}, no_pool)
    worker = wait_for(lambda: _started(job_dir, 0, "worker", 0), 30, "the worker")
    master = json.loads((job_dir / "master.json").read_text())["pid"]
    # The launch waited for the fork server, which forked the worker: the worker's
    # lifeline is the server, whose lifeline, like the master's, is the supervisor.
    [server] = _fork_servers(job_dir)
    assert _parent(worker) == server
    for pid in (server, master):
        assert _lifeline(pid) == f"{PARENT_ENV}={supervisor.pid}".encode()

    os.kill(supervisor.pid, signal.SIGKILL)
    everyone = (worker, master, server)
    wait_for(lambda: not any(map(alive, everyone)), 5, "the job's processes to end")


def test_a_fork_server_that_dies_takes_its_instances_and_the_next_one_forks_the_rest(supervise):
    job_dir = supervise.job_dir
    supervise(
        {
            "0": [
                ["serve"],
                ["launch", "worker", 0],
                ["wait_started", "worker", 0],
                ["wait_end", "worker", 0],  # the test kills the fork server meanwhile
                ["launch", "worker", 1],
                ["wait_started", "worker", 1],
                ["hang"],
            ]
        }
    )
    first = wait_for(lambda: _started(job_dir, 0, "worker", 0), 30, "worker 0")
    [server] = _fork_servers(job_dir)
    os.kill(server, signal.SIGKILL)

    second = wait_for(lambda: _started(job_dir, 0, "worker", 1), 60, "worker 1")
    assert not alive(first)
    ends = [e for e in _events(job_dir, 0) if e["kind"] != "started"]
    assert [(e["instance_id"], e["kind"], e["signal"], e["pid"]) for e in ends] == [
        (0, "killed", "SIGKILL", first)
    ]
    servers = _fork_servers(job_dir)
    assert len(servers) == 2 and servers[0] == server
    assert _parent(second) == servers[1]  # forked by the new server, once it was ready
    assert f"fork server (pid {server}) ended" in _log(job_dir)


def test_a_supervisor_told_to_stop_lets_its_master_stop_the_job_and_restarts_nothing(supervise):
    job_dir = supervise.job_dir
    supervisor = supervise({"0": [["serve"], ["on_sigterm", 2], ["launch", "worker", 0], ["hang"]]})
    worker = wait_for(lambda: _started(job_dir, 0, "worker", 0), 30, "the worker")
    master = json.loads((job_dir / "master.json").read_text())["pid"]

    os.kill(supervisor.pid, signal.SIGTERM)  # the supervisor alone: it tells the master
    assert supervisor.wait(30) == 0, _log(job_dir)
    assert json.loads((job_dir / "state.json").read_text())["state"] == "stopped"
    seen = _seen(job_dir)
    assert {s["incarnation"] for s in seen} == {0}
    ends = [e for e in _events(job_dir, 0) if e["kind"] != "started"]
    assert [(e["role"], e["instance_id"], e["pid"]) for e in ends] == [("worker", 0, worker)]
    assert seen.index({"incarnation": 0, "stopped": True}) > seen.index(
        {"incarnation": 0, "event": ends[0]}
    )  # the master heard the worker end before its shutdown returned
    assert not alive(worker) and not alive(master)
    assert "restarting" not in _log(job_dir)


def test_a_master_killed_by_the_stop_signal_is_not_restarted_and_the_job_is_stopped(supervise):
    job_dir = supervise.job_dir
    supervisor = supervise(
        {"0": [["serve"], ["launch", "chief", 0], ["launch", "worker", 0], ["hang"]]}
    )
    worker = wait_for(lambda: _started(job_dir, 0, "worker", 0), 30, "the worker")
    errors = [s["error"] for s in _seen(job_dir) if "error" in s]
    assert errors == [
        "the supervisor could not launch: ValueError: no such role to launch: 'chief'"
    ]

    os.kill(supervisor.pid, signal.SIGTERM)  # the master has no handler: it dies of it
    assert supervisor.wait(30) == 0, _log(job_dir)
    state = json.loads((job_dir / "state.json").read_text())
    assert state["state"] == "stopped"
    assert "stopped by SIGTERM; the master was killed by SIGTERM" in state["error"]
    assert not alive(worker)
    assert "restarting" not in _log(job_dir)


def test_a_first_master_that_never_serves_is_not_restarted(supervise):
    job_dir = supervise.job_dir
    supervisor = supervise({"0": [["exit", 2]]})
    assert supervisor.wait(30) == 2  # what start_master reports, with the master's log
    assert not (job_dir / "state.json").exists()
    assert "restarting" not in _log(job_dir)


def test_after_its_restart_budget_the_supervisor_fails_the_job_with_the_masters_last_words(
    supervise,
):
    job_dir = supervise.job_dir
    supervisor = supervise({"default": [["serve"], ["exit", 3]]})
    assert supervisor.wait(120) == 1, _log(job_dir)
    assert {s["incarnation"] for s in _seen(job_dir)} == set(range(MAX_RESTARTS + 1))
    assert _log(job_dir).count("restarting it") == MAX_RESTARTS
    state = json.loads((job_dir / "state.json").read_text())
    assert state["state"] == "failed"
    assert (
        f"the master died {MAX_RESTARTS + 1} times; the last one exited with code 3"
        in (state["error"])
    )
    assert f"stand-in master, incarnation {MAX_RESTARTS}" in state["error"]
    # the journal says so too, as its last event (no master was left to write it)
    last = json.loads((job_dir / "events.jsonl").read_text().splitlines()[-1])
    assert (last["kind"], last["data"]["state"], last["data"]["recorded_by"]) == (
        "job_state", "failed", "supervisor"
    )  # fmt: skip
