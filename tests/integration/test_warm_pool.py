"""The user's warm pool (backends/local/warm_pool.py), with real jobs: a later job's fork
server is forked by the pool the first one started, in its own session, tied to its
supervisor alone; the pool listens owner-only, answers its own uid only, leaves when idle
or when the files it imported change, and a pool killed mid-job harms neither that job
nor the next one. Every job here trains to the end with its ledger exact."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import elasticdl_nb as edl
from elasticdl_nb.backends.local.supervisor_protocol import encode
from elasticdl_nb.backends.local.warm_pool_link import (
    CHECK_ENV,
    IDLE_ENV,
    POOL_DIR_ENV,
    running_pools,
    stop_pools,
)
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.conftest import REPO, job_processes
from tests.integration.faults import alive, fault_rng, pid_of, wait_for, wait_for_step
from tests.integration.models import digits_job

pytestmark = pytest.mark.slow
EPOCHS = 2


@pytest.fixture
def pool_dir(monkeypatch):
    """A directory of pools of this test's own (the session's pools stay out of it),
    outside pytest's owner-only temporary tree: another uid may be let in."""
    directory = Path(tempfile.mkdtemp(prefix="edlnb-test-")) / "pools"
    monkeypatch.setenv(POOL_DIR_ENV, str(directory))
    yield directory
    for pid in stop_pools(directory):
        wait_for(lambda p=pid: not alive(p), 10, f"pool {pid} to leave")
    shutil.rmtree(directory.parent)


def _train(epochs: int = EPOCHS, **options) -> tuple[edl.Job, int]:
    job, (x, _), _ = digits_job(epochs=epochs, evaluate=False, **options)  # (ledger on)
    return job, len(x)


def _trained(job: edl.Job, records: int, epochs: int = EPOCHS) -> None:
    assert job.wait(timeout=300)["state"] == "succeeded"
    assert ledger_problems(job.dir, 1, [records], epochs) == []


def _forked_by(job: edl.Job) -> int | None:
    """The pid of the pool that forked the job's (first) fork server; None: it started
    as a new interpreter."""
    found = re.search(r"forked by warm pool (\d+)", (job.dir / "logs/forkserver.log").read_text())
    return int(found.group(1)) if found else None


def _supervisor(job: edl.Job) -> int:
    return json.loads((job.dir / "master.json").read_text())["supervisor_pid"]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_second_job_s_fork_server_comes_from_the_pool_the_first_one_started(job_home, pool_dir):
    first, records = _train(workers=1)
    _trained(first, records)
    [(sock, pool)] = running_pools(pool_dir).items()
    assert _forked_by(first) == pool  # the first job's came from it too, once it was ready
    assert stat.S_IMODE(pool_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600

    second, records = _train(workers=2, epochs=30)
    status = wait_for_step(second, 5)
    assert _forked_by(second) == pool
    worker = pid_of(status, "worker", 0)
    server = _parent(worker)
    assert _parent(server) == pool
    # The job's fork server left the pool's session; the pool is in none of the job's.
    supervisor = _supervisor(second)
    assert os.getsid(server) == server != os.getsid(pool)
    assert os.getsid(pool) != os.getsid(supervisor)
    assert "forkserver --job-dir " + str(second.dir) in _cmdline(server)
    assert second.stop()["state"] == "stopped"
    assert job_processes(job_home, every=True) == []
    assert not alive(server)
    assert running_pools(pool_dir) == {sock: pool}  # it waits for the next job


def test_a_killed_supervisor_takes_the_pool_s_fork_server_and_its_instances_along(
    job_home, pool_dir
):
    job, _ = _train(workers=2, epochs=30)
    status = wait_for_step(job, 5)
    workers = [pid_of(status, "worker", i) for i in range(2)]
    server = _parent(workers[0])
    assert _forked_by(job) == _parent(server)
    os.kill(_supervisor(job), signal.SIGKILL)
    everyone = [server, *workers, pid_of(status, "ps", 0)]
    # The server's lifeline is its supervisor's end of the connection; the instances'
    # is the server.
    wait_for(lambda: not any(map(alive, everyone)), 10, "the job's processes to end")
    assert len(running_pools(pool_dir)) == 1


def test_a_pool_killed_mid_job_harms_neither_that_job_nor_the_next(job_home, pool_dir):
    rng = fault_rng("pool-kill")
    job, records = _train(workers=2, epochs=6)
    status = wait_for_step(job, rng.randint(5, 60))
    [pool] = running_pools(pool_dir).values()
    os.kill(pool, signal.SIGKILL)
    print(f"killed the pool at step {status['step']}")
    # The job's fork server is its own: a worker killed now is forked again by it.
    os.kill(pid_of(status, "worker", 1), signal.SIGKILL)
    _trained(job, records, epochs=6)
    relaunched = [e.data for e in job.events(follow=False) if e.kind == "relaunch"]
    assert [(r["role"], r["replaces"]) for r in relaunched] == [("worker", 1)]

    after, records = _train(workers=1)  # a new pool, in place of the dead one's socket
    _trained(after, records)
    [new_pool] = running_pools(pool_dir).values()
    assert new_pool != pool and _forked_by(after) == new_pool


def test_an_idle_pool_leaves_and_no_pool_means_a_new_interpreter(job_home, pool_dir, monkeypatch):
    monkeypatch.setenv(IDLE_ENV, "2")
    job, records = _train(workers=1)
    _trained(job, records)
    [(sock, pool)] = running_pools(pool_dir).items()
    wait_for(lambda: not alive(pool), 30, "the idle pool to leave")
    assert not sock.exists()

    monkeypatch.setenv(IDLE_ENV, "0")  # pools off
    cold, records = _train(workers=1)
    _trained(cold, records)
    assert _forked_by(cold) is None
    assert running_pools(pool_dir) == {}


def test_the_pool_answers_no_other_uid(job_home, pool_dir):
    """Another uid cannot reach the pool's socket; were its file open to all, the pool
    would still fork nothing for another uid (it asks the kernel who connected)."""
    job, records = _train(workers=1)
    _trained(job, records)
    [(sock, pool)] = running_pools(pool_dir).items()
    request = encode({"op": "fork server", "job_dir": "/", "log": "/dev/null", "env": {}})

    def as_nobody() -> str:
        done = subprocess.run(
            [sys.executable, "-c", _SEND_AS_NOBODY, str(sock), request.decode()],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert as_nobody() == "PermissionError"
    pool_dir.parent.chmod(0o711)
    pool_dir.chmod(0o711)
    sock.chmod(0o666)
    assert as_nobody() == "closed without a word"
    assert "refused a request: PermissionError" in sock.with_suffix(".log").read_text()
    assert _children(pool) == []


_SEND_AS_NOBODY = textwrap.dedent("""
    import os, socket, sys
    os.setgid(65534); os.setuid(65534)
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(sys.argv[1])
    except PermissionError:
        print("PermissionError"); sys.exit()
    try:
        conn.sendall(sys.argv[2].encode())
        answer = conn.recv(100)
    except (ConnectionResetError, BrokenPipeError):
        answer = b""
    print("closed without a word" if answer == b"" else "answered")
""")


def test_a_pool_whose_files_changed_leaves_and_the_new_code_gets_a_pool_of_its_own(
    job_home, pool_dir, tmp_path, monkeypatch
):
    """As after `pip install -U`: the package is a copy here, whose file the test
    rewrites between two jobs."""
    monkeypatch.setenv(CHECK_ENV, "1")
    site = tmp_path / "site"
    shutil.copytree(
        REPO / "elasticdl_nb",
        site / "elasticdl_nb",
        ignore=shutil.ignore_patterns("__pycache__", "labextension"),
    )
    run = [sys.executable, "-c", _TRAIN_AND_SAY_THE_POOL]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}

    def pool_of_a_job() -> int:
        done = subprocess.run(run, env=env, cwd=site, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return int(done.stdout.split()[-1])

    before = pool_of_a_job()
    changed = site / "elasticdl_nb" / "runtime" / "worker" / "trainer.py"
    changed.write_text(changed.read_text() + "\n# upgraded\n")
    after = pool_of_a_job()
    assert after != before
    wait_for(lambda: not alive(before), 30, "the pool of the old files to leave")
    assert list(running_pools(pool_dir).values()) == [after]


_TRAIN_AND_SAY_THE_POOL = textwrap.dedent("""
    import re
    import elasticdl_nb as edl
    assert "/site/" in edl.__file__, edl.__file__
    from tests.integration.models import digits_job
    job, _, _ = digits_job(workers=1, epochs=1, evaluate=False)
    assert job.wait(timeout=300)["state"] == "succeeded"
    log = (job.dir / "logs/forkserver.log").read_text()
    print(re.search(r"forked by warm pool (\\d+)", log).group(1))
""")


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [
        int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split()
    ]


def test_a_pool_directory_another_user_could_enter_is_not_used(job_home, pool_dir):
    """A pool directory that another user could enter is not used: the job starts its
    fork server as a new interpreter (the pool's socket would carry the job's token)."""
    pool_dir.mkdir(mode=0o755)
    pool_dir.chmod(0o755)
    job, records = _train(workers=1)
    _trained(job, records)
    assert _forked_by(job) is None
    assert not list(pool_dir.glob("*.sock"))
