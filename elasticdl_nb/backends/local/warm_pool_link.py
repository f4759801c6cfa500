"""A local job's way to its user's warm pool (`warm_pool.py`): where the pool listens, which
pool fits the job, starting one when there is none, and asking it for the job's fork server.

A pool fits a job when a fork server it forks is the one a new interpreter would have
been: the same Python, the same files behind what the pool imported (TensorFlow, Keras,
NumPy, gRPC, this package: their locations on the job's `sys.path` and their
modification times), and the same environment where it is read at import time (`TF_*`,
`KERAS_*`, `OMP_*`, `PYTHON*`, ...). That fingerprint names the pool's socket, so a job
only ever reaches a pool that fits it: after `pip install -U` (or an edit of this
package's source) the next job's fingerprint differs, it starts a new pool, and the old
one, which checks its own fingerprint every minute, exits.

The pools live in one owner-only directory per user (`pool_dir`): the socket is reached
by path, not by an abstract name another user could connect to; the pool also checks
each caller's uid. Standard library only: the supervisor imports this.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from elasticdl_nb.backends.local.supervisor_protocol import encode

POOL_MODULE = "elasticdl_nb.backends.local.warm_pool"
POOL_DIR_ENV = "ELASTICDL_NB_WARM_POOL_DIR"  # where a user's pools listen (default below)
IDLE_ENV = "ELASTICDL_NB_WARM_POOL_IDLE"  # seconds a pool waits for a job; 0: no pool
DEFAULT_IDLE_SECONDS = 900.0
CHECK_ENV = "ELASTICDL_NB_WARM_POOL_CHECK"  # how often a pool checks that its files are current
DEFAULT_CHECK_SECONDS = 60.0
BIND_SECONDS = 5.0  # a new pool binds its socket within ~0.1 s (before its imports)
SOCKET_PATH_MAX = 107  # sun_path's size, less the terminating NUL

# Environment variables read when TensorFlow, Keras, NumPy and gRPC are imported (or that
# shape the interpreter itself): a pool started with other values would not be the job's.
IMPORT_TIME_ENV = ("TF_", "KERAS_", "OMP_", "KMP_", "MKL_", "CUDA_", "XLA_", "GRPC_", "PYTHON")
# What the pool imports, by top-level package: where each resolves on the job's path.
PRELOADED_PACKAGES = ("numpy", "tensorflow", "keras", "grpc", "google.protobuf", "elasticdl_nb")


def idle_seconds(environ: dict[str, str]) -> float:
    """How long a pool waits for the next job; 0 turns pools off."""
    return _seconds(environ, IDLE_ENV, DEFAULT_IDLE_SECONDS)


def _seconds(environ: dict[str, str], name: str, default: float) -> float:
    try:
        return max(0.0, float(environ.get(name, default)))
    except ValueError:
        return default


def pool_dir(environ: dict[str, str]) -> Path:
    """The user's directory of pools: `$ELASTICDL_NB_WARM_POOL_DIR`, else the session's
    runtime directory (`$XDG_RUNTIME_DIR`), else one under `~/.cache`."""
    if environ.get(POOL_DIR_ENV):
        return Path(environ[POOL_DIR_ENV])
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "elasticdl-nb"
    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    return home / ".cache" / "elasticdl-nb" / "warm-pools"


def owner_only_dir(path: Path) -> bool:
    """Make `path` (0700) if it is not there; whether it is ours alone. A directory that
    another user owns, or can enter, is not used."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def fingerprint(environ: dict[str, str], path: list[str]) -> str:
    """What a fork server's imports depend on, for a job with this environment and
    `sys.path` (see the module's docstring)."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        digest.update(repr(parts).encode())

    add(sys.executable, sys.version)
    for name in sorted(environ):
        if name.startswith(IMPORT_TIME_ENV) and name != "PYTHONPATH":  # (the path: below)
            add(name, environ[name])
    for package in PRELOADED_PACKAGES:
        top, *rest = package.split(".")
        spec = importlib.machinery.PathFinder.find_spec(top, path)
        locations = list(spec.submodule_search_locations or []) if spec else []
        origin = Path(spec.origin) if spec and spec.origin else None
        if rest and locations:  # (google.protobuf: a namespace package's part)
            origin = Path(locations[0], *rest, "__init__.py")
        add(package, str(origin), _stamp(origin))
    # This package's own source, whole: an edit of it must not run in an older pool.
    here = Path(__file__).resolve().parents[2]
    for root, dirs, files in os.walk(here):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                file = Path(root, name)
                add(str(file), _stamp(file))
    return digest.hexdigest()[:16]


def _stamp(file: Path | None) -> tuple[int, int] | None:
    try:
        info = file.stat() if file else None
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size) if info else None


def pool_socket(environ: dict[str, str], path: list[str]) -> Path | None:
    """The socket of the pool that fits a job with this environment and path, in the
    user's pool directory; None where there can be none (pools off, a directory not
    ours alone, a path too long for a socket)."""
    if idle_seconds(environ) <= 0:
        return None
    directory = pool_dir(environ)
    sock = directory / f"{fingerprint(environ, path)}.sock"
    if len(os.fsencode(sock)) > SOCKET_PATH_MAX or not owner_only_dir(directory):
        return None
    return sock


def pool_environ(environ: dict[str, str], directory: Path) -> dict[str, str]:
    """A pool's environment: the job's, less what is the job's own (its token, TLS
    directory, temporary directory, and every other `ELASTICDL_NB_*` setting, which a
    fork server gets from its job instead), with temporary files in the pool directory."""
    kept = {
        name: value
        for name, value in environ.items()
        if not name.startswith("ELASTICDL_NB_") or name in (POOL_DIR_ENV, IDLE_ENV, CHECK_ENV)
    }
    kept["TMPDIR"] = str(directory / "tmp")
    return kept


def ask_for_fork_server(
    sock_path: Path, environ: dict[str, str], job_dir: Path, log: Path
) -> socket.socket:
    """A connection to the pool at `sock_path` (started if there is none), on which it
    has been asked for a fork server of the job: from then on it is that fork server's
    socket (`forkserver.py`'s messages; its `ready` carries its pid). Raises OSError if
    no pool could be reached."""
    conn = _connect(sock_path)
    if conn is None:
        _start_pool(sock_path, environ)
        deadline = time.monotonic() + BIND_SECONDS
        while conn is None and time.monotonic() < deadline:
            time.sleep(0.01)
            conn = _connect(sock_path)
        if conn is None:
            raise OSError(
                f"no warm pool listens at {sock_path} {BIND_SECONDS:.0f} s after its start"
            )
    request = {
        "op": "fork server",
        "job_dir": str(job_dir),
        "log": str(log),
        "env": environ,
        "cwd": os.getcwd(),
        "path": sys.path,
    }
    conn.sendall(encode(request))
    return conn


def _connect(sock_path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock_path))
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    return conn


def _start_pool(sock_path: Path, environ: dict[str, str]) -> None:
    """Start a pool for `sock_path`, detached: it outlives the job, in a session of its
    own (a job's stop signals its own session), and it is nobody's child once its first
    process exits (it forks and leaves at once). Two jobs that start one at the same time
    start two; the second finds the first's lock and leaves."""
    directory = sock_path.parent
    args = ["--socket", str(sock_path), "--idle", str(idle_seconds(environ))]
    args += ["--check", str(_seconds(environ, CHECK_ENV, DEFAULT_CHECK_SECONDS))]
    with open(directory / f"{sock_path.stem}.log", "ab") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", POOL_MODULE, *args],
            env=pool_environ(environ, directory),
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    first.wait()  # it forks the pool and exits, in the time it takes Python to start


def running_pools(directory: Path) -> dict[Path, int]:
    """The pools that serve in `directory`: socket -> pid (each writes its pid into its
    lock file, which it holds while it serves)."""
    pools = {}
    for lock in directory.glob("*.lock"):
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free: nobody serves there
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            text = lock.read_text().strip()
            if text.isdigit():
                pools[lock.with_suffix(".sock")] = int(text)
        finally:
            os.close(fd)
    return pools


def stop_pools(directory: Path) -> list[int]:
    """SIGTERM every pool that serves in `directory` (the jobs they started run on);
    returns their pids."""
    pids = list(running_pools(directory).values())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return pids
