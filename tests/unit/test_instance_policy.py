"""The elastic policy on what a cluster does to pods, in the master's InstanceManager:
InstanceState.OOM gives the replacement more memory (until the backend has no more to give), an
instance ends once however often it is reported, and an instance pending too long is
journaled (a worker's job goes on; a PS's fails). Only the launcher is a stand-in: the
policy must not care which backend reports."""

from __future__ import annotations

import time

from elasticdl_nb.runtime.master.instances import InstanceManager
from elasticdl_nb.runtime.master.journal import Journal
from elasticdl_nb.runtime.master.site import InstanceEvent
from elasticdl_nb.vocabulary import InstanceState
from tests.unit.masters import RecordingLauncher


class Launcher(RecordingLauncher):
    def __init__(self, memory_steps: list[str]):
        super().__init__()
        self.memory_steps = list(memory_steps)  # what grow_memory answers, in turn

    def grow_memory(self, role: str) -> str | None:
        return self.memory_steps.pop(0) if self.memory_steps else None


def manager(
    launcher, failures: list[str], start: bool = True, **options
) -> tuple[InstanceManager, Journal]:
    """A manager over `launcher`; `start`: it launches the job's instances (a master that
    takes over replays them instead)."""
    journal = Journal()
    instances = InstanceManager(
        lambda on_event: launcher,
        journal,
        workers=1,
        ps=1,
        max_worker_relaunches=1,
        max_ps_relaunches=1,
        on_worker_lost=lambda worker_id: None,
        on_job_failed=failures.append,
        **options,
    )
    if start:
        instances.start()
    return instances, journal


def kinds(journal: Journal) -> list[str]:
    return [e.kind for e in journal.read(0, follow=False)]


def test_oom_raises_memory_without_spending_the_crash_budget_until_the_cap():
    launcher, failures = Launcher(["256Mi -> 512Mi", "512Mi -> 1Gi"]), []
    instances, journal = manager(launcher, failures)
    for worker_id in (0, 1, 2):  # two OOMs with more memory each, then at the cap
        instances.on_event(InstanceEvent("worker", worker_id, InstanceState.OOM, exit_code=137))
    raised = [e.data["memory"] for e in journal.read(0, follow=False) if e.kind == "memory_raised"]
    assert raised == ["256Mi -> 512Mi", "512Mi -> 1Gi"]
    assert instances.counts.worker_crashes == 1  # only the InstanceState.OOM at the cap counted
    assert launcher.launched[-1] == ("worker", 3)  # still within the budget of 1
    instances.on_event(InstanceEvent("worker", 3, InstanceState.OOM, exit_code=137))
    assert "relaunch_refused" in kinds(journal)
    assert failures and "budget of 1 worker relaunches is used up" in failures[0]


def test_an_instance_ends_once_however_often_it_is_reported():
    launcher, failures = Launcher([]), []
    instances, journal = manager(launcher, failures)
    preempted = InstanceEvent("worker", 0, InstanceState.PREEMPTED, reason="PreemptionByScheduler")
    instances.on_event(preempted)
    instances.on_event(
        InstanceEvent("worker", 0, InstanceState.PREEMPTED, exit_code=143, reason="again")
    )
    relaunches = [e.data for e in journal.read(0, follow=False) if e.kind == "relaunch"]
    assert [r["replaces"] for r in relaunches] == [0]
    assert launcher.launched.count(("worker", 1)) == 1 and ("worker", 2) not in launcher.launched


def test_pending_too_long_is_journaled_a_worker_is_waited_for_a_ps_fails_the_job():
    launcher, failures = Launcher([]), []
    instances, journal = manager(launcher, failures, pending_timeout=0.2)
    instances.on_event(
        InstanceEvent("worker", 0, InstanceState.PENDING, reason="unschedulable: no cpu")
    )
    instances.on_event(InstanceEvent("ps", 0, InstanceState.RUNNING))
    deadline = time.monotonic() + 5
    while "pending_too_long" not in kinds(journal) and time.monotonic() < deadline:
        time.sleep(0.02)
    late = [e.data for e in journal.read(0, follow=False) if e.kind == "pending_too_long"]
    assert late == [{"role": "worker", "id": 0, "seconds": 0.2, "reason": "unschedulable: no cpu"}]
    assert failures == []  # the job goes on with the workers it has

    instances.on_event(
        InstanceEvent("ps", 0, InstanceState.OOM, exit_code=137)
    )  # relaunched, then stuck
    instances.on_event(InstanceEvent("ps", 0, InstanceState.PENDING, reason="ErrImagePull: denied"))
    deadline = time.monotonic() + 5
    while not failures and time.monotonic() < deadline:
        time.sleep(0.02)
    assert failures == ["PS 0 could not start within 0.2 s (ErrImagePull: denied); the job "
                        "cannot train without it."]  # fmt: skip


def test_a_process_that_reached_the_wrong_server_fails_the_job_with_its_reason():
    from elasticdl_nb.runtime.exit_codes import WRONG_PEER_EXIT
    from elasticdl_nb.vocabulary import InstanceState

    said = "the master at 127.0.0.1:4242 refused this job's token"
    for role in ("worker", "ps"):
        launcher, failures = Launcher([]), []
        instances, journal = manager(
            launcher, failures, log_tail=lambda r, i, lines: f"ERROR {said}"
        )
        instances.on_event(InstanceEvent(role, 0, InstanceState.FAILED, exit_code=WRONG_PEER_EXIT))
        assert len(failures) == 1 and f"{role} 0 reached the wrong server" in failures[0]
        assert said in failures[0]
        assert f"The last lines of its log (job.logs('{role}', 0))" in failures[0]
        assert "relaunch" not in kinds(journal)  # a replacement would meet the same server
        assert launcher.launched.count((role, 0)) == 1


def test_ending_a_worker_returns_at_once_and_a_refused_kill_is_tried_again(monkeypatch):
    """A kill (an API call on Kubernetes) may hang or be refused on a busy cluster: the
    caller, which holds the job's lock, does not wait for it, and a refusal neither
    fails the job nor stops the tries."""
    import threading

    from elasticdl_nb.runtime.master import instances as module

    monkeypatch.setattr(module, "KILL_RETRY_SECONDS", 0.01)
    answered, refusals = threading.Event(), [RuntimeError("the API server timed out")] * 2

    class Busy(Launcher):
        def kill(self, role: str, instance_id: int, force: bool = False) -> None:
            time.sleep(0.2)
            if refusals:
                raise refusals.pop()
            self.killed.append((role, instance_id, force))
            answered.set()

    launcher, failures = Busy([]), []
    launcher.killed = []
    instances, _ = manager(launcher, failures)
    started = time.monotonic()
    instances.end_soon("worker", 0)
    assert time.monotonic() - started < 0.1  # (each try takes 0.2 s)
    assert answered.wait(5), "the kill was not tried again"
    assert launcher.killed == [("worker", 0, True)] and not refusals and failures == []


def test_a_ready_standby_takes_a_lost_worker_s_place_and_another_stands_by():
    launcher, failures, woken = Launcher([]), [], []
    instances, journal = manager(
        launcher, failures, standby=2, on_work_for=lambda: woken.append(True)
    )
    # worker 0 trains; 1 and 2 stand by, at the lowest priority; 2 asked for work first.
    assert launcher.launched == [("ps", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    assert launcher.elastic == {1, 2} and instances.active_workers() == [0]
    for worker_id in (0, 1, 2):
        instances.on_event(InstanceEvent("worker", worker_id, InstanceState.RUNNING))
    assert instances.stands_by(2) and not instances.takes_work(2) and instances.takes_work(0)
    instances.on_event(InstanceEvent("worker", 0, InstanceState.KILLED, exit_code=-9))
    [relaunch] = [e.data for e in journal.read(0, follow=False) if e.kind == "relaunch"]
    assert relaunch["id"] == 2 and relaunch["replaces"] == 0 and relaunch["promoted"]
    assert woken and instances.takes_work(2) and instances.active_workers() == [2]
    assert launcher.launched[-1] == ("worker", 3) and 3 in launcher.elastic
    assert sorted(instances.standby_ids()) == [1, 3]
    # A standby that dies holds no work: another stands by, nothing is promoted.
    instances.on_event(
        InstanceEvent("worker", 1, InstanceState.PREEMPTED, reason="by the scheduler")
    )
    assert [e.data["id"] for e in journal.read(0, follow=False) if e.kind == "relaunch"] == [2]
    assert launcher.launched[-1] == ("worker", 4) and sorted(instances.standby_ids()) == [3, 4]
    assert not failures

    # A master that takes over knows who stands by and who was promoted, from the journal.
    for worker_id in (3, 4):  # (as the backend reports them)
        instances.on_event(InstanceEvent("worker", worker_id, InstanceState.STARTED))
    again, _ = manager(Launcher([]), failures, start=False, standby=2)
    for event in journal.read(0, follow=False):
        again.replay(event.kind, event.data)
    assert again.active_workers() == [2] and sorted(again.standby_ids()) == [3, 4]
