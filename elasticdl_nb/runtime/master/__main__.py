"""The master process: `python -m elasticdl_nb.runtime.master --job-dir DIR`.

Started detached by the SDK (a kernel restart does not end the job), or as a job's master
pod. It serves the Master service, launches the parameter servers and workers through the
job's backend (its "site": local processes or pods), runs the job to its end, then stops
every instance it started and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import threading
from pathlib import Path

from elasticdl_nb.backends.local.registry import write_json
from elasticdl_nb.backends.local.submit import log_tail
from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.logs import setup_logging
from elasticdl_nb.runtime.master.instances import InstanceManager
from elasticdl_nb.runtime.master.job_master import JobMaster
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.service import MasterService
from elasticdl_nb.runtime.process_env import ProcessEnv
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol.auth import token_from_env
from elasticdl_nb.runtime.protocol.channels import make_server
from elasticdl_nb.spec import JobSpec

log = logging.getLogger("elasticdl_nb.master")


def _copy_job_files(source: Path, job_dir: Path) -> None:
    """The job's files from a mounted ConfigMap into the job directory. A ConfigMap volume
    holds its files behind `..data` symlinks; those hidden entries are not copied."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_dir():
            shutil.copytree(entry, job_dir / entry.name, dirs_exist_ok=True)
        else:
            shutil.copyfile(entry, job_dir / entry.name)


# Kubernetes shows this file's content as the pod's termination message (4 KB at most):
# the final state reaches the notebook even where it cannot read the shared volume.
TERMINATION_LOG = Path("/dev/termination-log")


def _write_termination_message(status: dict) -> None:
    text = json.dumps(status)
    if len(text) > 4000:
        text = json.dumps({k: status.get(k) for k in ("name", "state", "error")})[:4000]
    try:
        TERMINATION_LOG.write_text(text)
    except OSError:
        pass  # not in a pod that has one


def _site(spec: JobSpec, name: str, job_dir: Path):
    if spec.backend == "kubernetes":
        from elasticdl_nb.backends.kubernetes.master_site import KubernetesSite

        return KubernetesSite(spec, name)
    from elasticdl_nb.backends.local.master_site import LocalSite

    return LocalSite(job_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument(
        "--copy-from", type=Path, help="copy the job's files from here first (a ConfigMap)"
    )
    args = parser.parse_args()
    setup_logging("master")
    job_dir: Path = args.job_dir
    if args.copy_from:
        _copy_job_files(args.copy_from, job_dir)
    token = token_from_env()
    spec = JobSpec.from_json((job_dir / "spec.json").read_text())
    name = spec.name
    sources = json.loads((job_dir / "sources.json").read_text())
    train = [SourceInfo.from_dict(s) for s in sources["train"]]
    validation = [SourceInfo.from_dict(s) for s in sources["validation"]]

    # Each worker may hold a thread for up to a second while it long-polls for a task.
    server = make_server(token, "master", threads=64)
    try:
        site = _site(spec, name, job_dir)
    except Exception as exc:  # e.g. the cluster refused the PS Services: say so, and why
        log.error("the master cannot start: %s", exc)
        status = {"name": name, "state": "failed", "error": f"the master cannot start: {exc}"}
        write_json(job_dir / "state.json", status)
        if spec.backend == "kubernetes":
            _write_termination_message(status)
        raise SystemExit(1) from None
    address = site.bind(server)
    ps_addrs = site.ps_addrs
    env = ProcessEnv(token, job_dir, address, tuple(ps_addrs))

    journal = Journal(job_dir / "events.jsonl")
    contract_cache: list = []

    def load_contract():
        if not contract_cache:
            from elasticdl_nb.model import load_bundle

            contract_cache.append(load_bundle(env.bundle_dir))
        return contract_cache[0]

    master = JobMaster(
        spec, name, journal, train, validation, ps_addrs, token, job_dir, load_contract
    )  # (ps_addrs: fixed ones, else empty: each PS reports where it serves)
    rpc.add_MasterServicer_to_server(MasterService(master), server)
    holder: list[InstanceManager] = []
    launcher = site.launcher(env.to_environ(), lambda ev: holder[0].on_event(ev))
    instances = InstanceManager(
        launcher,
        journal,
        workers=spec.workers,
        ps=spec.parameter_servers,
        max_worker_relaunches=spec.max_worker_relaunches,
        max_ps_relaunches=spec.max_ps_relaunches,
        on_worker_lost=master.worker_lost,
        on_ps_lost=master.ps_lost,
        on_job_failed=master.fail,
        lock=master.lock,
        pending_timeout=spec.pending_timeout,
        log_tail=lambda role, i, lines: log_tail(job_dir / "logs" / f"{role}-{i}.log", lines),
    )
    holder.append(instances)
    master.instances = instances

    server.start()
    write_json(job_dir / "master.json", {"address": address, "pid": os.getpid()})
    log.info("master of %s serving on %s", name, address)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(
            sig, lambda signum, _: master.stop(f"master got {signal.Signals(signum).name}")
        )

    instances.start()
    threading.Thread(target=master.run, name="coordinator", daemon=True).start()
    while not master.finished.wait(0.5):  # a timed wait keeps signal handlers responsive
        pass

    log.info("job %s %s; stopping instances", name, master.state)
    instances.shutdown(grace_seconds=5)
    status = master.status()
    journal.close()  # event streams deliver what is left and end
    server.stop(grace=2).wait()
    write_json(job_dir / "state.json", status)  # last: its presence means the job is over
    if spec.backend == "kubernetes":
        _write_termination_message(status)
    log.info("master exits")


if __name__ == "__main__":
    main()
