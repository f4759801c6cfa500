"""A real JobMaster and InstanceManager wired as the master process wires them, with a
recording launcher in place of processes (for unit tests of the master's decisions)."""

from __future__ import annotations

from pathlib import Path

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.master.instances import InstanceManager
from elasticdl_nb.runtime.master.job_master import JobMaster
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import InstanceState


class RecordingLauncher:
    def __init__(self):
        self.launched: list[tuple[str, int]] = []

    def launch(self, role: str, instance_id: int) -> None:
        self.launched.append((role, instance_id))

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        pass

    def shutdown(self, grace_seconds: float) -> None:
        pass


def started_master(job_dir: Path, workers: int = 2, ps: int = 1, records: int = 40) -> JobMaster:
    """A master whose instances have all started (minibatches of 10, one per task)."""
    spec = JobSpec.from_options(
        data=["x"], workers=workers, ps=ps, minibatch_size=10, minibatches_per_task=1
    )
    journal = Journal()
    master = JobMaster(
        spec,
        "job",
        journal,
        train=[SourceInfo("train", "npy", records)],
        validation=[SourceInfo("validation", "npy", 20)],
        ps_addrs=[],
        token="t",
        job_dir=job_dir,
        load_contract=None,
    )
    launcher = RecordingLauncher()
    master.instances = InstanceManager(
        launcher,
        journal,
        workers=workers,
        ps=ps,
        max_worker_relaunches=5,
        max_ps_relaunches=5,
        on_worker_lost=master.worker_lost,
        on_ps_lost=master.ps_lost,
        on_job_failed=master.fail,
        lock=master.lock,
    )
    master.instances.start()
    for role, instance in launcher.launched:
        master.instances.on_event(
            InstanceEvent(role, instance, InstanceState.STARTED, pid=100 + instance)
        )
    return master
