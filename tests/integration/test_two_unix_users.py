"""Two Unix users on one machine (a JupyterHub without Kubernetes runs each notebook
server as its user): user B's local job is invisible and untouchable to user A.

One real job of B's (digits, 1 worker, 1 PS) runs as B for the whole module, in B's own
home. A is another non-root user (root may read anything): from A's account, the
SDK and the CLI neither list nor open it (`JobNotYours`, one paragraph, no traceback),
its files and the environment of its processes are unreadable, its master's socket
cannot even be connected to, and its PS's ports, which any local user can find (loopback
TCP has no permissions), refuse every call and every bulk connection without B's token,
at once, while the job trains on.

The test process itself (root) only watches: it reads B's files to learn the ports and
pids, and checks from the outside what B's job processes hold (sockets) and left
(files outside B's home).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest

from elasticdl_nb.backends.local.warm_pool_link import pool_dir, stop_pools
from tests.integration.faults import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
OWNER = "edlnb-other"  # B: runs the job
INTRUDER = "edlnb-a"  # A: another user of the machine, not root
JOB = f"isolated-{os.getpid()}"
CALL_SECONDS = 5.0  # every refusal must come within this (refused, never hung)
SHARED_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/dev/mqueue")


# ---------------------------------------------------------------------- the two users


def _as_user(user: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The command line that runs `argv` as `user` with a clean environment of ours."""
    environ = {
        "HOME": pwd.getpwnam(user).pw_dir,
        "USER": user,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        **(env or {}),
    }
    switch = ["runuser", "-u", user, "--"] if os.geteuid() == 0 else ["sudo", "-n", "-u", user]
    return [*switch, "env", "-i", *(f"{k}={v}" for k, v in environ.items()), *argv]


def _run_as(user: str, argv: list[str], timeout: float, env: dict[str, str] | None = None):
    """`argv` as `user`, in their home; its output captured."""
    return subprocess.run(
        _as_user(user, argv, env),
        cwd=pwd.getpwnam(user).pw_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _python_as(user: str, code: str, *args: str, timeout: float = 120, env=None):
    return _run_as(user, [sys.executable, "-c", textwrap.dedent(code), *args], timeout, env)


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _reachable_by_everyone(paths: list[Path]) -> list[tuple[Path, int]]:
    """Add o+x (search only, not read) to every directory above `paths` that lacks it;
    returns [(dir, its old mode)] to put back. On this test machine the interpreter the
    venv points at lives under /root (0700), which the other users must traverse to run
    it; the repository and the venv are world-readable already (a fresh clone is)."""
    changed = []
    for path in paths:
        for directory in [*reversed(path.parents), path]:
            mode = directory.stat().st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)
                changed.append((directory, stat.S_IMODE(mode)))
    return changed


@pytest.fixture(scope="session")
def two_users():
    """B (`OWNER`) and A (`INTRUDER`), created once (idempotently) and able to run the
    venv's Python."""
    missing = [u for u in (OWNER, INTRUDER) if not _user_exists(u)]
    if os.geteuid() != 0:
        if missing:
            pytest.skip(f"not root, and no user {' or '.join(missing)} to run as: create them")
        if subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
            pytest.skip(f"not root, and `sudo -n` cannot run as {OWNER} and {INTRUDER}")
    for user in missing:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", user],
            check=True,
            capture_output=True,
        )
    changed = []
    if os.geteuid() == 0:
        interpreter = Path(os.path.realpath(sys.executable))
        changed = _reachable_by_everyone([interpreter.parent, Path(sys.prefix), REPO])
    for user in (OWNER, INTRUDER):
        home = Path(pwd.getpwnam(user).pw_dir)
        # A home that others may enter (the default of many distributions): the job's
        # files must be protected by the job directory alone, not by the home's mode.
        if os.geteuid() == 0:
            os.chmod(home, 0o755)
        probe = _python_as(user, "import elasticdl_nb, grpc, sklearn, tests.integration.models")
        assert probe.returncode == 0, f"{user} cannot run {sys.executable}: {probe.stderr}"
    yield
    for directory, mode in reversed(changed):
        os.chmod(directory, mode)


# ---------------------------------------------------------------------- B's job

START_JOB = """
    import json, sys
    import elasticdl_nb as edl
    from tests.integration.models import DIGITS, custom_model, digits_split, paced_loss
    (x, y), _ = digits_split()
    job = edl.train(custom_model, loss=paced_loss, optimizer=DIGITS["optimizer"],
                    data=(x, y), workers=1, ps=1, epochs=200, minibatch_size=32,
                    checkpoint_steps=5, name=sys.argv[1])
    print(json.dumps({"name": job.name, "dir": str(job.dir)}))
"""

STOP_JOB = """
    import sys
    import elasticdl_nb as edl
    print(edl.attach(sys.argv[1]).stop()["state"])
"""


class OwnersJob:
    """B's running job, as root sees it from the outside."""

    def __init__(self, name: str, job_dir: Path):
        self.name, self.dir = name, job_dir
        self.uid = pwd.getpwnam(OWNER).pw_uid
        self.home = Path(pwd.getpwnam(OWNER).pw_dir)
        self.token = json.loads((job_dir / "job.json").read_text())["token"]
        self.owned_before: set[str] = set()  # B's in the shared places before the job

    def master(self) -> dict:
        return json.loads((self.dir / "master.json").read_text())

    def status(self) -> dict:
        from elasticdl_nb.backends.job_records import JobRecord
        from elasticdl_nb.sdk.job import Job

        record = JobRecord(self.name, self.dir, self.token, 0.0)
        return Job(record).status()

    def ps_endpoints(self) -> tuple[str, int, int]:
        """(gRPC address, bulk port, pid) of PS 0, as its log and the status say (the
        pid of the one running, None while it is being relaunched)."""
        log = (self.dir / "logs" / "ps-0.log").read_text()
        line = [x for x in log.splitlines() if "PS 0 serving on" in x][-1]  # (the newest)
        address = line.split("serving on ")[1].split()[0]
        bulk = int(line.rsplit("port ", 1)[1].rstrip(")"))
        pid = next(i["pid"] for i in self.status()["instances"] if i["role"] == "ps")
        return address, bulk, pid

    def pids(self) -> list[int]:
        """Every process running as B (B runs nothing but this job here)."""
        return [pid for pid in _all_pids() if _uid_of(pid) == self.uid]


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _uid_of(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1])


def _pool_dir(user: str) -> Path:
    """Where `user`'s warm pools listen (backends/local/warm_pool.py): in their home."""
    return pool_dir({"HOME": pwd.getpwnam(user).pw_dir})


@pytest.fixture(scope="module")
def owners_job(two_users):
    """B's job: started as B, training until the module is done, then stopped as B."""
    home = Path(pwd.getpwnam(OWNER).pw_dir)
    shutil.rmtree(home / ".elasticdl-nb", ignore_errors=True)  # a run before this one's
    # B's notebook keeps its own temporary files to itself (its business, not the job's:
    # what the job's processes write is what the tests below look for).
    notebook_tmp = home / "notebook-tmp"
    _run_as(OWNER, ["mkdir", "-p", "-m", "700", str(notebook_tmp)], timeout=10)
    owned_before = _owned_in_shared_places(pwd.getpwnam(OWNER).pw_uid)
    started = _python_as(OWNER, START_JOB, JOB, timeout=180, env={"TMPDIR": str(notebook_tmp)})
    assert started.returncode == 0, started.stdout + started.stderr
    info = json.loads(started.stdout.splitlines()[-1])
    job = OwnersJob(info["name"], Path(info["dir"]))
    job.owned_before = owned_before
    try:
        wait_for(lambda: job.status().get("step", 0) >= 3, 120, "B's job to train")
        wait_for(lambda: list((job.dir / "checkpoints").rglob("*")), 60, "a checkpoint")
        yield job
    finally:
        stop_pools(_pool_dir(OWNER))  # (B's warm pool, which B's job started)
        stopped = _python_as(OWNER, STOP_JOB, JOB, timeout=90)
        if stopped.returncode != 0 or stopped.stdout.strip() != "stopped":
            from elasticdl_nb.backends.job_records import JobRecord
            from elasticdl_nb.backends.local.submit import kill_job

            kill_job(JobRecord(job.name, job.dir, job.token, 0.0), grace_seconds=2)
            pytest.fail(f"B could not stop its job: {stopped.stdout} {stopped.stderr}")


# ---------------------------------------------------------------------- what A tries

# Run as A: every attempt on B's job, each bounded in time; prints {attempt: outcome}.
INTRUDE = r"""
import json, os, signal, socket, sys, time
from pathlib import Path

import grpc

import elasticdl_nb as edl
from elasticdl_nb.backends import job_records
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.protocol.frames import HELLO, TOKEN_LEN, hello

target = json.loads(sys.argv[1])
job_dir, name = Path(target["dir"]), target["name"]
outcomes = {}


def attempt(what, action):
    started = time.monotonic()
    try:
        outcome = {"returned": repr(action())}
    except grpc.RpcError as err:
        outcome = {"grpc": err.code().name, "message": err.details()}
    except Exception as err:
        outcome = {"raised": type(err).__name__, "message": str(err),
                   "elasticdl": isinstance(err, ElasticDLError)}
    outcome["seconds"] = round(time.monotonic() - started, 2)
    outcomes[what] = outcome


# -- the SDK, in A's own job home, then pointed at B's
attempt("jobs, own home", lambda: [j["name"] for j in edl.jobs()])
attempt("attach by path", lambda: edl.attach(str(job_dir)))
os.environ["ELASTICDL_NB_HOME"] = target["elasticdl_home"]
attempt("jobs, B's home", lambda: edl.jobs())
attempt("attach, B's home", lambda: edl.attach(name))
attempt("create a job, B's home", lambda: job_records.create_job("planted"))
del os.environ["ELASTICDL_NB_HOME"]

# -- B's files
for relative in ("job.json", "master.json", "spec.json", "events.jsonl", "logs/master.log",
                 "logs/ps-0.log", "logs/worker-0.log", "bundle/manifest.json"):
    attempt(f"read {relative}", lambda: (job_dir / relative).read_bytes()[:10])
for relative in ("", "checkpoints", "logs"):
    attempt(f"list {relative or 'the job directory'}", lambda: os.listdir(job_dir / relative))
attempt("list the jobs root", lambda: os.listdir(job_dir.parent))

# -- B's processes: their environment holds the token; signals would stop them
for pid in target["pids"]:
    attempt(f"read environ of {pid}", lambda: Path(f"/proc/{pid}/environ").read_bytes()[:10])
attempt("SIGTERM the supervisor", lambda: os.kill(target["supervisor_pid"], signal.SIGTERM))

# -- B's master: a socket file in B's job directory
master = target["master_address"]
def connect_unix():
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(master.split(":", 1)[1])
    finally:
        sock.close()
attempt("connect to the master's socket", connect_unix)
attempt("master GetStatus, no token", lambda: rpc.MasterStub(grpc.insecure_channel(master))
        .GetStatus(pb.Empty(), timeout=5))
attempt("master Stop, wrong token", lambda: rpc.MasterStub(open_channel(master, "guess", "master"))
        .Stop(pb.StopRequest(reason="A"), timeout=5))

# -- B's PS: loopback TCP, which anyone can find (the owner's uid and all) and reach
def listening_ports_of(uid):
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[7]) == uid:  # LISTEN
                ports.add(int(fields[1].split(":")[1], 16))
    return sorted(ports)
outcomes["B's listening ports, as A finds them"] = listening_ports_of(target["uid"])

ps, bulk = target["ps_address"], target["bulk_port"]
attempt("ps GetBulkEndpoint, no token", lambda: rpc.ParameterServerStub(
    grpc.insecure_channel(ps)).GetBulkEndpoint(pb.Empty(), timeout=5))
attempt("ps Checkpoint, wrong token", lambda: rpc.ParameterServerStub(
    open_channel(ps, "guess", "ps-0")).Checkpoint(pb.Empty(), timeout=5))
attempt("ps GetApplied, empty token", lambda: rpc.ParameterServerStub(
    grpc.insecure_channel(ps)).GetApplied(pb.AppliedRequest(), timeout=5,
                                          metadata=[("authorization", "Bearer ")]))

def bulk_hello(first_bytes):
    sock = socket.create_connection(("127.0.0.1", bulk), timeout=5)
    try:
        sock.sendall(first_bytes)
        answer = sock.recv(1)  # READY (b"\x01") would let us in; b"" is a refusal
        return answer
    finally:
        sock.close()
attempt("bulk hello, wrong token", lambda: bulk_hello(hello("guess", "ps-0")))
attempt("bulk hello, no token", lambda: bulk_hello(HELLO + TOKEN_LEN.pack(0)))
attempt("bulk, not a hello", lambda: bulk_hello(b"GET / HTTP/1.0\r\n\r\n"))

print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def intrusion(owners_job):
    """What A's attempts on B's job came to, and B's job before and after them."""
    ps_address, bulk_port, ps_pid = owners_job.ps_endpoints()
    before = owners_job.status()
    target = {
        "name": owners_job.name,
        "dir": str(owners_job.dir),
        "elasticdl_home": str(owners_job.home / ".elasticdl-nb"),
        "uid": owners_job.uid,
        "pids": owners_job.pids(),
        "supervisor_pid": owners_job.master()["supervisor_pid"],
        "master_address": owners_job.master()["address"],
        "ps_address": ps_address,
        "bulk_port": bulk_port,
    }
    run = _python_as(INTRUDER, INTRUDE, json.dumps(target), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return {
        "outcomes": json.loads(run.stdout.splitlines()[-1]),
        "target": target,
        "before": before,
        "ps_pid": ps_pid,
    }


# ---------------------------------------------------------------------- the tests


def test_the_intruder_is_another_non_root_user(two_users, owners_job):
    intruder, owner = pwd.getpwnam(INTRUDER), pwd.getpwnam(OWNER)
    assert intruder.pw_uid != 0 and intruder.pw_uid != owner.pw_uid
    who = _run_as(INTRUDER, ["id", "-u"], timeout=10)
    assert who.stdout.strip() == str(intruder.pw_uid)
    assert all(_uid_of(pid) == owner.pw_uid for pid in owners_job.pids())
    assert owners_job.pids(), "B's job runs as B"


def test_the_owner_lists_and_opens_its_own_job(owners_job):
    seen = _python_as(
        OWNER,
        """
        import json, sys
        import elasticdl_nb as edl
        names = [j["name"] for j in edl.jobs()]
        print(json.dumps([names, edl.attach(sys.argv[1]).status()["state"]]))
        """,
        JOB,
        timeout=60,
    )
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout) == [[JOB], "running"]


def test_another_user_lists_no_job_of_the_owner(intrusion):
    assert intrusion["outcomes"]["jobs, own home"]["returned"] == "[]"
    listed = _run_as(INTRUDER, [sys.executable, "-m", "elasticdl_nb", "list"], timeout=30)
    assert listed.returncode == 0 and JOB not in listed.stdout + listed.stderr


def test_another_user_cannot_open_the_owners_job_and_is_told_why(intrusion):
    outcomes = intrusion["outcomes"]
    for attempt in ("jobs, B's home", "attach, B's home", "attach by path"):
        refused = outcomes[attempt]
        assert refused.get("raised") == "JobNotYours" and refused["elasticdl"], (attempt, refused)
        assert f"belongs to user '{OWNER}'" in refused["message"], (attempt, refused)
        assert f"this is '{INTRUDER}'" in refused["message"], (attempt, refused)
        assert refused["seconds"] < CALL_SECONDS
    planted = outcomes["create a job, B's home"]
    assert planted.get("raised") == "JobNotYours", planted


@pytest.mark.parametrize("command", ["list", "status", "logs", "stop", "scale"])
def test_the_cli_refuses_another_users_job_in_one_line(intrusion, command):
    args = {"list": [], "scale": [JOB, "--workers", "2"]}.get(command, [JOB])
    run = _run_as(
        INTRUDER,
        [sys.executable, "-m", "elasticdl_nb", command, *args],
        timeout=30,
        env={"ELASTICDL_NB_HOME": intrusion["target"]["elasticdl_home"]},
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: Cannot open ") and f"user '{OWNER}'" in run.stderr
    assert "Traceback" not in run.stderr


def test_another_user_cannot_read_the_owners_files_or_process_environments(intrusion):
    outcomes = intrusion["outcomes"]
    reads = [k for k in outcomes if k.startswith(("read ", "list "))]
    assert len(reads) == 8 + 3 + 1 + len(intrusion["target"]["pids"])
    for attempt in reads:
        assert outcomes[attempt].get("raised") == "PermissionError", (attempt, outcomes[attempt])
    killed = outcomes["SIGTERM the supervisor"]
    assert killed.get("raised") == "PermissionError", killed


def test_another_user_cannot_reach_the_owners_master(intrusion, owners_job):
    outcomes = intrusion["outcomes"]
    assert intrusion["target"]["master_address"] == f"unix:{owners_job.dir}/master.sock"
    assert outcomes["connect to the master's socket"].get("raised") == "PermissionError"
    for attempt in ("master GetStatus, no token", "master Stop, wrong token"):
        refused = outcomes[attempt]
        assert refused.get("grpc") == "UNAVAILABLE", (attempt, refused)
        assert "Permission denied" in refused["message"], (attempt, refused)
        assert refused["seconds"] < CALL_SECONDS


def test_even_a_process_that_reaches_the_master_is_refused_without_the_token(owners_job):
    """Root can open the socket file that A cannot: the token still guards the master
    (as it guards it at an abstract address, where a too-long job path puts it)."""
    from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
    from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
    from elasticdl_nb.runtime.protocol.channels import open_channel

    address = owners_job.master()["address"]
    for channel in (grpc.insecure_channel(address), open_channel(address, "guess", "master")):
        with pytest.raises(grpc.RpcError) as refused:
            rpc.MasterStub(channel).Stop(pb.StopRequest(reason="not the owner"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert owners_job.status()["state"] == "running"


def test_the_owners_ps_is_findable_but_refuses_every_call_without_the_token(intrusion):
    outcomes, target = intrusion["outcomes"], intrusion["target"]
    ps_port = int(target["ps_address"].rsplit(":", 1)[1])
    # Loopback ports have no owner-only mode: A sees them, and B's uid on them.
    assert {ps_port, target["bulk_port"]} <= set(outcomes["B's listening ports, as A finds them"])
    for attempt in (
        "ps GetBulkEndpoint, no token",
        "ps Checkpoint, wrong token",
        "ps GetApplied, empty token",
    ):
        refused = outcomes[attempt]
        assert refused.get("grpc") == "UNAUTHENTICATED", (attempt, refused)
        assert refused["seconds"] < CALL_SECONDS
    for attempt in ("bulk hello, wrong token", "bulk hello, no token", "bulk, not a hello"):
        refused = outcomes[attempt]
        # Closed, never READY (b"\x01"): at once, or reset when the peer's bytes were
        # left unread.
        closed = refused.get("returned") == "b''"
        assert closed or refused.get("raised") == "ConnectionResetError", (attempt, refused)
        assert refused["seconds"] < CALL_SECONDS


def test_the_owners_job_trains_on_unharmed(intrusion, owners_job):
    before = intrusion["before"]
    wait_for(lambda: owners_job.status().get("step", 0) > before["step"] + 5, 60, "more steps")
    status = owners_job.status()
    assert status["state"] == "running"
    _, _, ps_pid = owners_job.ps_endpoints()
    assert ps_pid == intrusion["ps_pid"], "the PS was not restarted"
    ps_log = (owners_job.dir / "logs" / "ps-0.log").read_text()
    assert ps_log.count("refused: wrong job token or not for ps-0") >= 3


def test_the_owners_job_holds_no_socket_another_user_could_name(owners_job):
    """Every Unix socket of B's job processes is unnamed (socketpairs: supervisor, fork
    server, signal wake-ups), the master's, in the owner-only job directory, or B's warm
    pool's, in B's owner-only directory of pools; every TCP listener is on loopback
    (token-guarded, above)."""
    unix_paths = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        unix_paths[fields[6]] = fields[7] if len(fields) > 7 else ""
    tcp_listeners = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                tcp_listeners[fields[9]] = fields[1]
    named, listeners = set(), set()
    for pid in owners_job.pids():
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            if not link.startswith("socket:["):
                continue
            inode = link[len("socket:[") : -1]
            if unix_paths.get(inode):
                named.add(unix_paths[inode])
            if inode in tcp_listeners:
                listeners.add(tcp_listeners[inode].split(":")[0])
    # B's warm pool listens in B's owner-only directory of pools (the pool and the job's
    # fork server, its child, hold that socket).
    pools = _pool_dir(OWNER)
    assert pools.stat().st_uid == owners_job.uid and stat.S_IMODE(pools.stat().st_mode) == 0o700
    pool_sockets = {str(sock) for sock in pools.glob("*.sock")}
    assert named - pool_sockets == {str(owners_job.dir / "master.sock")}
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, as IPv4 or v6
    assert listeners and listeners <= loopback
    assert stat.S_IMODE((owners_job.dir).stat().st_mode) == 0o700
    assert stat.S_IMODE((owners_job.dir.parent).stat().st_mode) == 0o700
    assert stat.S_IMODE((owners_job.dir / "job.json").stat().st_mode) == 0o600


def test_the_token_is_on_no_command_line(owners_job):
    for pid in owners_job.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert owners_job.token.encode() not in cmdline, pid


def _owned_in_shared_places(uid: int) -> set[str]:
    """Every path in the machine's shared places (temporary files, shared memory, named
    pipes, lock files) that `uid` owns."""
    found = set()
    for shared in SHARED_PLACES:
        if not os.path.isdir(shared):
            continue
        for root, dirs, files in os.walk(shared, onerror=lambda _: None):
            for entry in dirs + files:
                path = os.path.join(root, entry)
                try:
                    if os.lstat(path).st_uid == uid:
                        found.add(path)
                except OSError:
                    continue
    return found


def test_the_owners_job_leaves_nothing_outside_its_home(owners_job):
    """No file of B's job in the shared places: everything it writes is in B's job
    directory. (Measured against what B's uid owned there before the job: the machine
    may have files of that uid from elsewhere, e.g. pods run as it by other tests.)"""
    found = sorted(_owned_in_shared_places(owners_job.uid) - owners_job.owned_before)
    assert found == []
    # They went to the job's private temporary directory instead.
    private = owners_job.dir / "tmp"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert list(private.glob("__autograph_generated_file*")), "the job's autograph files"
