"""The master's phases change only through its transitions table (runtime/master/phases.py):
every change is journaled with the phase it left, the one way back (finishing ->
training, when a PS lost work at the very end) is allowed, and any other move is a bug
that raises naming the moves so far."""

from __future__ import annotations

import threading
import time

import pytest

from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.phases import TRANSITIONS, IllegalPhaseChange, Phases
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.vocabulary import EventKind, JobState, Phase
from tests.unit.masters import started_master


def phase_events(journal: Journal) -> list[tuple[str, str]]:
    return [
        (e.data["previous"], e.data["phase"])
        for e in journal.read(0, follow=False)
        if e.kind == EventKind.PHASE
    ]


def test_every_phase_can_be_reached_and_every_one_but_done_left():
    assert set(TRANSITIONS) == set(Phase)
    assert [p for p in Phase if not TRANSITIONS[p]] == [Phase.DONE]
    reached = set().union(*TRANSITIONS.values())
    assert reached == set(Phase)


def test_the_way_back_from_finishing_to_training_is_allowed_and_journaled():
    journal = Journal()
    phases = Phases(journal.append)
    order = [Phase.EVALUATING, Phase.EXPORTING, Phase.FINISHING, Phase.TRAINING]
    for phase in order:
        phases.move(phase)
    assert phases.current == Phase.TRAINING
    assert phase_events(journal) == [
        ("training", "evaluating"),
        ("evaluating", "exporting"),
        ("exporting", "finishing"),
        ("finishing", "training"),
    ]


def test_an_illegal_move_raises_naming_the_history_and_changes_nothing():
    journal = Journal()
    phases = Phases(journal.append)
    phases.move(Phase.EVALUATING)
    with pytest.raises(IllegalPhaseChange) as raised:
        phases.move(Phase.FINISHING)
    message = str(raised.value)
    assert "from evaluating to finishing" in message
    assert "phases so far: training -> evaluating" in message
    assert phases.current == Phase.EVALUATING and len(phase_events(journal)) == 1


def run_to_success(master) -> list[pb.Task]:
    """Run `master`'s coordinator, and be its one worker until the job is over; returns
    the tasks it was given."""
    threading.Thread(target=master.run, daemon=True).start()
    deadline = time.monotonic() + 20
    task, given = master.get_task(0, wait_seconds=5), []
    while task.type != pb.FINISHED and time.monotonic() < deadline:
        given.append(task)
        if task.type in (pb.TRAINING, pb.EXPORT, pb.PREDICTION):
            starts = [task.range.start] if task.type == pb.TRAINING else []
            master.report(
                pb.ProgressReport(
                    worker_id=0, task_id=task.task_id, batch_starts=starts, task_done=True
                )
            )
        task = master.get_task(0, wait_seconds=1)
    assert master.state == JobState.SUCCEEDED
    return given


def test_a_job_journals_each_phase_it_passes_through_on_its_way_to_success(tmp_path):
    # Allreduce: no PS to ask, so the coordinator runs the whole job on its own thread.
    master = started_master(
        tmp_path, workers=1, validation_records=0, strategy="allreduce", epochs=2
    )
    run_to_success(master)
    assert phase_events(master.journal) == [
        ("training", "evaluating"),
        ("evaluating", "exporting"),
        ("exporting", "finishing"),
        ("finishing", "done"),
    ]
    assert master.phases.history == [
        Phase.TRAINING,
        Phase.EVALUATING,
        Phase.EXPORTING,
        Phase.FINISHING,
        Phase.DONE,
    ]


def test_a_job_with_prediction_data_predicts_once_trained_and_before_the_export(tmp_path):
    master = started_master(
        tmp_path, workers=1, validation_records=0, prediction_records=25, strategy="allreduce"
    )
    given = run_to_success(master)
    assert phase_events(master.journal) == [
        ("training", "evaluating"),
        ("evaluating", "predicting"),
        ("predicting", "exporting"),
        ("exporting", "finishing"),
        ("finishing", "done"),
    ]
    kinds = [t.type for t in given]
    assert kinds.index(pb.PREDICTION) > max(i for i, k in enumerate(kinds) if k == pb.TRAINING)
    assert kinds.index(pb.EXPORT) > max(i for i, k in enumerate(kinds) if k == pb.PREDICTION)
    # Tasks of the prediction data, each to a file of its own in the job's directory.
    predicted = [
        (t.range.start, t.range.end, t.output_path) for t in given if t.type == pb.PREDICTION
    ]
    where = tmp_path / "predictions"
    assert predicted == [
        (0, 10, str(where / "00000-000000000000.npz")),
        (10, 20, str(where / "00000-000000000010.npz")),
        (20, 25, str(where / "00000-000000000020.npz")),
    ]
    events = list(master.journal.read(0, follow=False))
    done = [e.data for e in events if e.kind == EventKind.PREDICTION_TASK]
    assert [(d["start"], d["records"]) for d in done] == [(0, 10), (10, 10), (20, 5)]
    assert [e.data for e in events if e.kind == EventKind.PREDICTIONS] == [
        {"path": str(where), "records": 25}
    ]


def test_a_succeeded_job_says_its_last_epoch_whole_and_the_phase_done(tmp_path):
    # `epoch` is 0-based (clients show epoch + 1): the last of 3 is 2, with all its records.
    master = started_master(
        tmp_path, workers=1, validation_records=0, strategy="allreduce", epochs=3
    )
    run_to_success(master)
    status = master.status()
    end = [e.data for e in master.journal.read(0, follow=False) if e.kind == EventKind.JOB_STATE]
    for said in (status, end[-1]):
        assert (said["epoch"], said["epochs"]) == (2, 3)
        assert said["records_done"] == said["records_per_epoch"] == 40
        assert said["step"] == 12  # (3 epochs of 4 minibatches)
    assert end[-1]["state"] == status["state"] == JobState.SUCCEEDED
    assert status["phase"] == Phase.DONE
    assert status["model_path"] == master.export_path != ""
