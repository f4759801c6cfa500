"""`serve`: the life of a job's master process, given where it stands (its site).

It serves the Master service, launches the parameter servers and workers through the
site's launcher (local processes or pods), runs the job to its end, then stops every
instance it started, writes the final state and returns. A master that finds the journal
of an earlier one (which died: its supervisor or the platform restarted it) takes the
job over where that one was (`recovery.py`) instead of starting it. The process's entry point,
which picks the site by the job's backend, sits above the runtime
(`elasticdl_nb.backends.master_process`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from elasticdl_nb.runtime.job_dir import JobDir, write_json
from elasticdl_nb.runtime.master import recovery
from elasticdl_nb.runtime.master.assembly import build_master
from elasticdl_nb.runtime.master.compaction import Compactor
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.saturation import MAX_CALLS, THREADS
from elasticdl_nb.runtime.master.service import MasterService
from elasticdl_nb.runtime.master.site import MasterSite
from elasticdl_nb.runtime.master.tensorboard_log import TensorBoardLog
from elasticdl_nb.runtime.process_env import ProcessEnv, tls_dir_from_environ
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.auth import token_from_env
from elasticdl_nb.runtime.protocol.channels import make_server
from elasticdl_nb.runtime.protocol.server_load import ServerLoad
from elasticdl_nb.runtime.protocol.tls import MASTER
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import JobState

log = logging.getLogger("elasticdl_nb.master")

SUPERVISOR_PID_ENV = "ELASTICDL_NB_SUPERVISOR_PID"


def serve(job_dir: Path, site_for: Callable[[JobSpec, Path], MasterSite]) -> None:
    """Run the job in `job_dir` to its end; `site_for(spec, job_dir)` makes the site."""
    token = token_from_env()
    env = ProcessEnv(token, job_dir, "", (), tls_dir=tls_dir_from_environ(), identity=MASTER)
    files = env.files
    spec = files.read_spec()
    name = spec.name
    sources = env.load_sources()
    train, validation = sources["train"], sources["validation"]

    # At most MAX_CALLS calls at once, on THREADS threads; beyond, callers wait their
    # turn (saturation.py).
    load = ServerLoad(MAX_CALLS, THREADS)
    server = make_server(token, MASTER, load=load)
    site = site_for(spec, job_dir)
    _open(site, files, name)
    address = site.bind(server, env.tls)
    env = dataclasses.replace(env, master_addr=address, ps_addrs=tuple(site.ps_addrs))

    # A new master continues an earlier one's journal; one that another has replaced
    # since (the site's fence) adds nothing to it.
    journal = Journal(files.events, fence=site.fence.check)
    # (follows the journal from where the event file ends: tensorboard_log.py)
    tensorboard = TensorBoardLog(journal, files.tensorboard).start() if spec.tensorboard else None
    master = build_master(
        spec,
        job_dir,
        journal,
        token=token,
        tls=env.tls,
        train=train,
        validation=validation,
        prediction=sources.get("prediction", []),
        launcher_for=lambda on_event: site.launcher(env.to_environ(), on_event),
        ps_addrs=site.ps_addrs,  # fixed ones, else empty: each PS reports where it serves
        server_load=load,
    )
    if journal.continued:  # the master before this one died: take the job over
        recovery.take_over(master, files, journal)
    rpc.add_MasterServicer_to_server(MasterService(master), server)

    server.start()
    _write_master_file(files, address)
    log.info("master of %s serving on %s", name, address)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(
            sig, lambda signum, _: master.stop(f"master got {signal.Signals(signum).name}")
        )

    if master.incarnation:
        recovery.resume(master)
    else:
        master.start_instances()
    with master.lock:
        master.floor.check()  # (below a range's MIN until enough workers ask for work)
    threading.Thread(target=master.run, name="coordinator", daemon=True).start()
    if spec.journal_compact_every:  # (a job of days: a bounded journal, a quick takeover)
        Compactor(master, files.master_snapshot, spec.journal_compact_every).start()
    while not master.finished.wait(0.5):  # a timed wait keeps signal handlers responsive
        pass

    log.info("job %s %s; stopping instances", name, master.state)
    master.instances.shutdown(grace_seconds=5)
    status = master.status()
    journal.close()  # event streams deliver what is left and end
    if tensorboard:
        tensorboard.close()
    # The final state before the server goes: a client that finds no master finds the
    # end (after it, one saw the job "starting" and tried to reach the gone master).
    _record_state(site, files, status)
    server.stop(grace=2).wait()
    site.job_ended(status)
    log.info("master exits")


def _open(site: MasterSite, files: JobDir, name: str) -> None:
    """Open the site; if it cannot be (e.g. the cluster refused the PS Services), the
    job ends `failed` saying why, and the process exits."""
    try:
        site.open()
    except Exception as exc:
        log.error("the master cannot start: %s", exc)
        error = f"the master cannot start: {exc}"
        _ended(site, files, {"name": name, "state": JobState.FAILED, "error": error})
        raise SystemExit(1) from None


def _write_master_file(files: JobDir, address: str) -> None:
    """Where this master serves, for clients and for a master that takes over."""
    write_json(
        files.master,
        {
            "address": address,
            "pid": os.getpid(),
            # A local job's supervisor: the process whose life is the job's (it restarts
            # a master that dies); None where the platform restarts the master.
            "supervisor_pid": int(os.environ.get(SUPERVISOR_PID_ENV) or 0) or None,
        },
    )


def _ended(site: MasterSite, files: JobDir, status: dict) -> None:
    """The job's final state: written (its presence means the job is over), then told to
    the site."""
    _record_state(site, files, status)
    site.job_ended(status)


def _record_state(site: MasterSite, files: JobDir, status: dict) -> None:
    """Write the job's final state, by a master not fenced off (once every instance is
    stopped and the journal closed: its presence means the job is over)."""
    site.fence.check()
    write_json(files.state, status)
