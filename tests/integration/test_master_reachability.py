"""A job's processes and their master, with real processes: a master that stops answering
for a while is waited for, a job's supervisor that dies takes every process of the job
with it, a stopped job leaves none and its master is not restarted, jobs started together
do not take each other's addresses, and a process that reaches the wrong server says so
and ends instead of retrying forever."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from elasticdl_nb.backends.job_records import find_job
from elasticdl_nb.backends.local.submit import kill_job
from elasticdl_nb.backends.local.warm_pool_link import IDLE_ENV
from elasticdl_nb.runtime.exit_codes import WRONG_PEER_EXIT
from elasticdl_nb.runtime.lifeline import PARENT_ENV
from elasticdl_nb.runtime.master.worker_silence import SILENCE_SECONDS
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from elasticdl_nb.vocabulary import INSTANCE_ENDED
from tests.conftest import job_processes
from tests.integration.faults import alive, fault_rng, wait_for, wait_for_step
from tests.integration.job_process import JobProcess, StubMaster
from tests.integration.models import digits_job, paced_loss

pytestmark = pytest.mark.slow


def _master_pid(job) -> int:
    return json.loads((Path(job.dir) / "master.json").read_text())["pid"]


def _supervisor_pid(job) -> int:
    return json.loads((Path(job.dir) / "master.json").read_text())["supervisor_pid"]


def _live_pids(job) -> dict[tuple[str, int], int]:
    """{(role, id): pid} of the job's workers and PS that run now."""
    return {
        (i["role"], i["id"]): i["pid"]
        for i in job.status()["instances"]
        if i["pid"] and i["state"] not in INSTANCE_ENDED
    }


def test_a_master_that_stops_answering_for_a_while_is_waited_for_by_every_process(job_home):
    rng = fault_rng("master-paused")
    epochs = 4
    job, (x, _), _ = digits_job(workers=2, epochs=epochs, loss=paced_loss, evaluate=False)
    wait_for_step(job, rng.randint(5, 40))
    before = _live_pids(job)
    assert len(before) == 3, before  # 2 workers, 1 PS
    master = _master_pid(job)

    os.kill(master, signal.SIGSTOP)
    seen_from_here: list[dict] = []  # the notebook asks meanwhile, and waits too
    asking = threading.Thread(target=lambda: seen_from_here.append(job.status()))
    try:
        asking.start()
        # Longer than any call's own timeout (GetTask and reports: 10 s), so every worker's
        # calls fail meanwhile and are retried.
        time.sleep(12 + rng.uniform(0, 2))
        assert [p for p in before.values() if not alive(p)] == []
        assert seen_from_here == []
    finally:
        os.kill(master, signal.SIGCONT)
    asking.join(10)
    assert seen_from_here[0]["state"] == "running", seen_from_here  # the master's answer

    assert job.wait(timeout=300)["state"] == "succeeded"
    events = list(job.events(follow=False))
    started = _started_pids(events)
    assert started == before  # nobody was relaunched: the same processes went on
    unexpected = [
        e.data
        for e in events
        if e.kind == "instance" and e.data["kind"] in INSTANCE_ENDED and not e.data["expected"]
    ]
    assert unexpected == []
    retried = [
        line
        for worker in (0, 1)
        for line in job.logs("worker", worker).splitlines()
        if "trying again" in line
    ]
    assert retried, "no worker call was retried: the pause did not test anything"
    print(f"{len(retried)} retried calls, e.g. {retried[0]}")
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []


def test_a_ps_that_stops_answering_for_a_while_is_waited_for_and_the_journal_says_so(job_home):
    """The PS frozen (SIGSTOP) for 12-14 s: what the workers and the master ask of it goes
    unanswered meanwhile and is answered once it thaws; nobody is relaunched, nothing is
    applied twice, and the journal says who could not reach ps-0, and for how long."""
    rng = fault_rng("ps-paused")
    epochs = 4
    job, (x, _), _ = digits_job(workers=2, epochs=epochs, loss=paced_loss, evaluate=False)
    wait_for_step(job, rng.randint(5, 40))
    before = _live_pids(job)
    paused = 12 + rng.uniform(0, 2)
    os.kill(before[("ps", 0)], signal.SIGSTOP)
    try:
        time.sleep(paused)
    finally:
        os.kill(before[("ps", 0)], signal.SIGCONT)

    assert job.wait(timeout=300)["state"] == "succeeded"
    events = list(job.events(follow=False))
    started = _started_pids(events)
    assert started == before  # nobody was relaunched
    outages = [e.data for e in events if e.kind == "peer_unreachable"]
    print(f"paused {paused:.1f} s; journal: {outages}")
    assert outages, "nobody said that ps-0 did not answer"
    for outage in outages:
        assert outage["peer"] == "ps-0" and outage["healed"], outage
        assert outage["by"] in ("worker 0", "worker 1", "master"), outage
        assert outage["seconds"] <= paused + 2, outage
    # The longest spell is the pause, as long as a call was waiting from its start (each
    # worker's exchange and the master's polls are never more than a second apart).
    assert max(o["seconds"] for o in outages) >= paused - 2, outages
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []


def test_a_worker_silent_with_a_task_is_given_up_on_within_the_budget(job_home):
    """A worker frozen (SIGSTOP: as silent as one cut off from the master) at a random
    step: SILENCE_SECONDS after its last word the master gives its work to the others
    and replaces it; the journal says why; every record once."""
    rng = fault_rng("worker-silent")
    epochs = 6
    job, (x, _), _ = digits_job(workers=2, epochs=epochs, loss=paced_loss, evaluate=False)
    wait_for_step(job, rng.randint(5, 40))
    frozen = _live_pids(job)[("worker", 0)]
    os.kill(frozen, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        assert job.wait(timeout=300)["state"] == "succeeded"
    finally:
        if alive(frozen):
            os.kill(frozen, signal.SIGKILL)
    events = list(job.events(follow=False))
    (gave_up,) = [e for e in events if e.kind == "peer_unreachable" and e.data["by"] == "master"]
    assert gave_up.data["peer"] == "worker-0" and not gave_up.data["healed"], gave_up.data
    requeued = [e for e in events if e.kind == "requeue" and e.data["worker"] == 0]
    relaunched = [e for e in events if e.kind == "relaunch" and e.data["replaces"] == 0]
    assert requeued and relaunched, "its work was not given back, or it was not replaced"
    # Its last word came at most a report interval (0.2 s) before the freeze; the master
    # looks every half second.
    waited = requeued[0].time - frozen_at
    print(f"worker 0 frozen; its work went back to the queue {waited:.1f} s later")
    assert SILENCE_SECONDS - 0.5 <= waited <= SILENCE_SECONDS + 2, waited
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("fork_server", ["a new interpreter", "from the warm pool"])
def test_a_supervisor_killed_by_sigkill_leaves_no_process_of_its_job_behind(
    job_home, fork_server, monkeypatch
):
    if fork_server == "a new interpreter":
        monkeypatch.setenv(IDLE_ENV, "0")  # pools off
    rng = fault_rng("supervisor-sigkill")
    job, _, _ = digits_job(workers=2, epochs=200, evaluate=False)
    wait_for_step(job, rng.randint(1, 30))
    supervisor = _supervisor_pid(job)
    pids = _live_pids(job)
    assert len(pids) == 3, pids
    server = _parent(pids[("ps", 0)])
    assert {_parent(pid) for pid in pids.values()} == {server}  # forked by the job's server
    pids[("master", 0)] = _master_pid(job)
    pids[("fork server", 0)] = server
    if fork_server == "a new interpreter":
        for (role, instance), pid in pids.items():  # the lifeline is armed in each of them
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"{PARENT_ENV}={supervisor}".encode() in environ, (
                f"{role} {instance} has no lifeline"
            )
    else:  # the server's lifeline is its connection to the supervisor (test_warm_pool.py)
        assert _parent(server) != supervisor and _parent(pids[("master", 0)]) == supervisor

    os.kill(supervisor, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not any(alive(p) for p in pids.values()), 5, "the job's processes to end")
    print(f"master, workers and PS gone {time.monotonic() - killed:.2f} s after the supervisor")
    assert job_processes(job_home, every=True) == []
    assert job.status()["state"] == "lost"


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_stopped_job_leaves_no_process_behind_and_its_master_is_not_restarted(job_home, how):
    job, _, _ = digits_job(workers=2, epochs=200, evaluate=False)
    wait_for_step(job, 3)
    master, supervisor = _master_pid(job), _supervisor_pid(job)

    if how == "stop":  # the master is asked (Stop), ends the job and exits
        assert job.stop()["state"] == "stopped"
    else:  # SIGTERM to the job's session (supervisor, master, workers, PS), then SIGKILL
        kill_job(find_job(job.name), grace_seconds=30)
        assert job.status()["state"] == "stopped"
    assert not alive(supervisor)
    assert job_processes(job_home, every=True) == []
    assert _master_pid(job) == master  # no other master has served since
    log = (Path(job.dir) / "logs" / "supervisor.log").read_text()
    assert "master incarnation 0 started" in log
    assert "restarting" not in log and "master incarnation 1" not in log, log


def test_three_jobs_started_at_the_same_moment_all_succeed(job_home):
    together = threading.Barrier(3)

    def start(i: int):
        together.wait()
        job, _, _ = digits_job(
            workers=1, ps=1, epochs=1, evaluate=False, check=False, name=f"together-{i}"
        )
        return job

    with ThreadPoolExecutor(3) as pool:
        jobs = list(pool.map(start, range(3)))
    for job in jobs:
        assert job.wait(timeout=400)["state"] == "succeeded", job.name
    addresses = [json.loads((Path(j.dir) / "master.json").read_text())["address"] for j in jobs]
    assert len(set(addresses)) == 3


@pytest.mark.parametrize("role", ["ps", "worker"])
@pytest.mark.parametrize(
    "token, identity, said",
    [
        ("another-job", "master", "refused this job's token: it is not a server of this job"),
        (None, "ps-0", "is another server of this job"),
    ],
    ids=["another-jobs-master", "a-ps-of-this-job"],
)
def test_a_process_whose_master_address_is_served_by_another_server_exits_saying_so(
    tmp_path, role, token, identity, said
):
    wrong = StubMaster(**({"token": token} if token else {}), identity=identity)
    process = JobProcess(tmp_path / "job", wrong, role)
    try:
        process.start(wait=False)
        code = process.proc.wait(120)  # (it imports TensorFlow first: seconds)
        log = process.log.read_text()
        assert code == WRONG_PEER_EXIT, log
        assert f"the master at {wrong.address} {said}" in log
    finally:
        process.stop()
        wrong.server.stop(0)


def _started_pids(events) -> dict[tuple[str, int], int]:
    """(role, id) -> pid of every instance the journal says was started."""
    return {
        (e.data["role"], e.data["id"]): e.data["pid"]
        for e in events
        if e.kind == "instance" and e.data["kind"] == "started"
    }
