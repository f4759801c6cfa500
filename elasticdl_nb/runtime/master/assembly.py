"""`build_master`: the one way to put a job's master together, used by the master process
(`serve.py`), the unit tests and the benchmarks alike.

It picks the training strategy by the spec's name for it (`STRATEGIES`) and hands the
`JobMaster` the way to make its launcher; the master makes its strategy and its
`InstanceManager` itself, each given what it calls back:

    MasterService -> JobMaster -> TrainingStrategy        (decisions)
                     JobMaster -> InstanceManager -> launcher (launch, kill)
    launcher -> InstanceManager.on_event -> JobMaster.worker_lost / fail, strategy.ps_lost
    TrainingStrategy -> JobMaster as JobControl (release, fail, end_worker, wake)

One lock, `JobMaster.lock`, is shared by all of them (see `JobMaster`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.allreduce_group import AllreduceGroup
from elasticdl_nb.runtime.master.instances import LauncherFor
from elasticdl_nb.runtime.master.job_master import JobMaster
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.ps_strategy import PsStrategy
from elasticdl_nb.runtime.master.strategy import JobControl, TrainingStrategy
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.protocol.server_load import ServerLoad
from elasticdl_nb.runtime.protocol.tls import JobTls, ps_name
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import Strategy

# (PS id, address) -> a channel to that PS with the job's credentials
PsChannel = Callable[[int, str], grpc.Channel]
# spec.strategy -> (the job, the spec, fixed PS addresses, PS channels) -> its strategy
STRATEGIES: dict[str, Callable[[JobControl, JobSpec, list[str], PsChannel], TrainingStrategy]] = {
    Strategy.PS: lambda job, spec, ps_addrs, ps_channel: PsStrategy(
        job, spec.parameter_servers, ps_addrs, ps_channel
    ),
    # (With a worker range, the first group forms once MIN members have joined.)
    Strategy.ALLREDUCE: lambda job, spec, ps_addrs, ps_channel: AllreduceGroup(
        job, spec.min_workers or spec.workers
    ),
}


def build_master(
    spec: JobSpec,
    job_dir: Path,
    journal: Journal,
    *,
    token: str,
    tls: JobTls | None = None,
    train: list[SourceInfo],
    validation: list[SourceInfo],
    launcher_for: LauncherFor,
    ps_addrs: list[str] | None = None,
    load_contract: Callable[[], object] | None = None,
    prediction: list[SourceInfo] = (),
    server_load: ServerLoad | None = None,
) -> JobMaster:
    """The master of the job `spec` whose directory is `job_dir`, journaling to `journal`.

    `launcher_for(on_event)` makes the launcher of its instances (the site's, with the
    process environment bound). `ps_addrs` are the PS addresses when they are fixed before
    any PS starts (else each PS reports where it serves). `token` and `tls` are what it
    reaches the PS with (`tls` None: plaintext); `prediction`: the data it predicts for
    once trained; `server_load`, its server's load, which it watches (saturation.py).
    `load_contract` gives the
    model's contract for merging evaluation metrics; by default the job's bundle is
    loaded on first use. Nothing is started: `master.start_instances()` launches the
    instances and `master.run()` drives the job."""
    make_strategy = STRATEGIES[spec.strategy]
    fixed = list(ps_addrs or [])

    def ps_channel(ps_id: int, address: str) -> grpc.Channel:
        return open_channel(address, token, ps_name(ps_id), tls=tls)

    return JobMaster(
        spec,
        journal,
        train,
        validation,
        job_dir,
        strategy_for=lambda job: make_strategy(job, spec, fixed, ps_channel),
        launcher_for=launcher_for,
        load_contract=load_contract or _bundle_loader(job_dir),
        prediction=prediction,
        server_load=server_load,
    )


def _bundle_loader(job_dir: Path) -> Callable[[], object]:
    """The job's contract, loaded once by whichever thread asks first (the evaluator
    and the callbacks' loader may ask at the same moment: a master that took a job over
    publishes a round while it loads the callbacks); the others wait for it."""
    loading = threading.Lock()
    loaded: list = []

    def load():
        from elasticdl_nb.model import load_bundle  # (imports TensorFlow: only if needed)

        with loading:
            if not loaded:
                loaded.append(load_bundle(JobDir(job_dir).bundle))
            return loaded[0]

    return load
