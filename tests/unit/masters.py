"""A real JobMaster and InstanceManager, put together by the master process's factory
(`assembly.build_master`), with a recording launcher in place of processes (for unit
tests of the master's decisions)."""

from __future__ import annotations

from pathlib import Path

from elasticdl_nb.data import SourceInfo
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.master.assembly import build_master
from elasticdl_nb.runtime.master.callbacks import CALLBACKS_FILE
from elasticdl_nb.runtime.master.job_master import JobMaster
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.vocabulary import InstanceState


class RecordingLauncher:
    def __init__(self):
        self.launched: list[tuple[str, int]] = []
        self.elastic: set[int] = set()  # the workers launched elastic

    def launch(self, role: str, instance_id: int, elastic: bool = False) -> None:
        self.launched.append((role, instance_id))
        if elastic:
            self.elastic.add(instance_id)

    def kill(self, role: str, instance_id: int, force: bool = False) -> None:
        pass

    def shutdown(self, grace_seconds: float) -> None:
        pass


def started_master(
    job_dir: Path,
    workers: int = 2,
    ps: int = 1,
    records: int = 40,
    validation_records: int = 20,
    journal: Journal | None = None,
    **options,
) -> JobMaster:
    """A master whose instances have all started (minibatches of 10, one per task), built
    by the master process's own factory. Its coordinator is not running: a test takes
    its steps (`start_epoch`, `start_evaluation`) itself, or runs `master.run`. `options`
    are more JobSpec options (`strategy`, `epochs`, ...); `journal`: in memory if None."""
    launcher = RecordingLauncher()
    master = built_master(
        job_dir,
        launcher,
        journal if journal is not None else Journal(),  # (an empty one is falsy)
        workers,
        ps,
        records,
        validation_records,
        **options,
    )
    master.start_instances()
    for role, instance in launcher.launched:
        master.instances.on_event(
            InstanceEvent(role, instance, InstanceState.STARTED, pid=100 + instance)
        )
    return master


def built_master(
    job_dir: Path,
    launcher,
    journal: Journal,
    workers: int = 2,
    ps: int = 1,
    records: int = 40,
    validation_records: int = 20,
    prediction_records: int = 0,
    **options,
) -> JobMaster:
    """A master as `started_master` makes it, with nothing started yet."""
    spec = JobSpec.from_options(
        data=["x"], workers=workers, ps=ps, minibatch_size=10, minibatches_per_task=1, **options
    )
    validation = [SourceInfo("validation", "npy", validation_records)] if validation_records else []
    bundle = JobDir(job_dir).bundle  # a model without callbacks (as its preflight records)
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / CALLBACKS_FILE).write_text("[]")
    return build_master(
        spec,
        job_dir,
        journal,
        token="t",
        train=[SourceInfo("train", "npy", records)],
        validation=validation,
        launcher_for=lambda on_event: launcher,
        prediction=[SourceInfo("prediction", "npy", prediction_records)]
        if prediction_records
        else [],
    )
