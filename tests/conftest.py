"""Shared test set-up: every test gets its own job home, and no job outlives its test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]


def job_processes(home: Path, every: bool = False) -> list[str]:
    """Command lines of the live worker and PS processes of jobs under `home` (`every`:
    their masters and supervisors too)."""
    kinds = (
        ("elasticdl_nb.runtime.", "elasticdl_nb.backends.") if every else ("elasticdl_nb.runtime.",)
    )
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if any(kind in cmdline for kind in kinds) and (
            str(home) in cmdline or f"ELASTICDL_NB_JOB_DIR={home}".encode() in environ
        ):
            found.append(f"{proc.name} {cmdline.strip()}")
    return found


@pytest.fixture
def job_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("ELASTICDL_NB_HOME", str(home))
    yield home
    # Stop whatever a failing test left running, so one failure does not cascade; a job
    # still running here was stuck or abandoned: its processes' stacks (SIGUSR1, see
    # runtime/logs.py) and log tails go into the test's report first.
    from elasticdl_nb.backends import job_records
    from elasticdl_nb.backends.local import submit

    strays = []
    for record in job_records.all_jobs():
        leftovers = job_processes(home)
        if leftovers:
            _report_stuck_job(record, leftovers)
        submit.kill_job(record, grace_seconds=2)
        strays += _payload_problems(record.files.events)
    # Every event a real job journaled has its kind's typed payload (vocabulary.events):
    # a writer that adds, drops or retypes a field fails the test that ran it.
    assert not strays, "journal events that stray from their payload types:\n" + "\n".join(
        strays[:20]
    )


def _payload_problems(journal: Path) -> list[str]:
    from elasticdl_nb.runtime.master.journal import read_journal_file
    from elasticdl_nb.vocabulary import payload_problems

    return [
        f"{journal.parent.name} event {event.seq}: {problem}"
        for event in read_journal_file(journal)
        for problem in payload_problems(event.kind, event.data)
    ]


def _report_stuck_job(record, processes: list[str]) -> None:
    import signal
    import time

    for line in processes:
        try:
            os.kill(int(line.split()[0]), signal.SIGUSR1)
        except (ProcessLookupError, ValueError):
            pass
    time.sleep(0.5)  # the stack dumps are written by each process itself
    for log in sorted(record.files.logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        useful = [x for x in lines if not x.startswith(("I0000", "WARNING: All log"))]
        print(f"--- {record.name}: {log.name} (last 60 lines)")
        print("\n".join(useful[-60:]))


@pytest.fixture(scope="session", autouse=True)
def warm_pools():
    """The session's local jobs share warm pools (backends/local/warm_pool.py), as a
    user's jobs do, in a directory of the session's: none outlives it, and the user's
    own pools are left alone. Tests of the pools themselves use directories of their
    own."""
    import shutil
    import tempfile

    from elasticdl_nb.backends.local.warm_pool_link import IDLE_ENV, POOL_DIR_ENV, stop_pools

    directory = Path(tempfile.mkdtemp(prefix="edlnb-pools-"))
    saved = {name: os.environ.get(name) for name in (POOL_DIR_ENV, IDLE_ENV)}
    os.environ[POOL_DIR_ENV] = str(directory)
    os.environ[IDLE_ENV] = "300"  # (a pool of a rare environment does not sit out the run)
    yield directory
    stop_pools(directory)
    shutil.rmtree(directory, ignore_errors=True)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def ipython_shell():
    """One real IPython shell for the session, with `%load_ext elasticdl_nb` done
    (IPython's test shell can be started only once per process)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "elasticdl_nb")
    return shell


@pytest.fixture(scope="session")
def s3_server():
    """One real S3-compatible server (moto) on loopback for the session, credentials
    enforced; see tests/s3_server.py."""
    from tests.s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()
