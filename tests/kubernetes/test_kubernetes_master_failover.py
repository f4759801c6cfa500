"""The master survives its own death on the real node (conftest's `real_node`), as it does
locally (tests/integration/test_master_failover.py):

- its container SIGKILLed at a random step: the kubelet restarts it in the same pod (the
  Job's pods are `OnFailure`), and the new master finds the journal in the job
  directory and takes the job over;
- then its pod deleted at a later random step: the master leaves the job as it is (its
  Job stays), the Job controller makes a new master pod, which takes the job over.

Each time the workers and PS go on in the same pods; the job succeeds with every record
applied exactly once (the PS ledger), and the journal and a follower of `Job.events()`
(through the port-forward, to whichever pod is the master) see one unbroken sequence.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import elasticdl_nb as edl
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from elasticdl_nb.vocabulary import INSTANCE_ENDED
from tests.integration.faults import fault_rng, follow_events, wait_for, wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split
from tests.kubernetes.job_pods import close_forward, k8s_options, pods
from tests.kubernetes.test_kubernetes_jobs import STEPS_PER_EPOCH, _paced_loss

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


def _journal(job) -> list[dict]:
    """The journal as the master appends it to the shared volume."""
    path = Path(job.dir) / "events.jsonl"
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return events


def _restarts(job) -> list[dict]:
    return [e for e in _journal(job) if e["kind"] == "master_restarted"]


def _master_pod(core, namespace: str):
    """The master pod that is not being deleted (there is one while the job runs)."""
    live = [
        p for p in pods(core, namespace, "master").values() if not p.metadata.deletion_timestamp
    ]
    return live[0] if len(live) == 1 else None


def _instance_pods(core, namespace: str) -> dict[str, str]:
    """Worker and PS pods by name, with their uid: the same uid is the same pod."""
    return {
        name: p.metadata.uid
        for name, p in pods(core, namespace).items()
        if p.metadata.labels["elasticdl-nb/role"] in ("worker", "ps")
    }


def _taken_over(job, restarts: int, since: float) -> float:
    """Seconds from `since` (wall clock) until the journal says the master number
    `restarts` took over."""
    wait_for(lambda: len(_restarts(job)) >= restarts, 180, "the new master", poll=0.2)
    return _restarts(job)[restarts - 1]["time"] - since


def _kill_the_master_twice(job, core, real_node, namespace, kill_at: int, delete_at: int):
    """SIGKILL the master's process at step `kill_at`, then delete its pod at step
    `delete_at`; each time, until the next master took the job over in the same worker
    and PS pods."""
    # 1. The master's process SIGKILLed: the kubelet restarts it in its pod.
    wait_for_step(job, kill_at, timeout=300)
    master = _master_pod(core, namespace)
    instances = _instance_pods(core, namespace)
    assert len(instances) == 3, instances
    pid = real_node.container_pid(master.status.container_statuses[0].container_id)
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    took = _taken_over(job, 1, killed)
    print(f"container SIGKILLed: the restarted master took over {took:.2f} s later")

    def restarts_of_its_container():
        again = _master_pod(core, namespace)
        assert (again.metadata.name, again.metadata.uid) == (
            master.metadata.name,
            master.metadata.uid,
        )
        return again.status.container_statuses[0].restart_count

    # (The kubelet reports the restart in the pod's status a moment later.)
    assert wait_for(restarts_of_its_container, 30, "the restart in the pod's status") == 1
    assert _instance_pods(core, namespace) == instances  # the same pods, no relaunch

    # 2. The master pod deleted (default grace): the Job makes a new one.
    wait_for_step(job, delete_at, timeout=300)
    core.delete_namespaced_pod(master.metadata.name, namespace)
    deleted = time.time()
    took = _taken_over(job, 2, deleted)
    print(f"pod deleted: the master of a new pod took over {took:.2f} s later")
    new = wait_for(lambda: _master_pod(core, namespace), 60, "one master pod")
    assert new.metadata.name != master.metadata.name
    assert new.metadata.name.startswith(f"{job.name}-master-")
    assert new.status.container_statuses[0].restart_count == 0
    assert _instance_pods(core, namespace) == instances


def test_a_master_killed_in_its_container_then_its_pod_deleted_the_job_goes_on(
    job_home, job_namespace, real_node, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("kubernetes-master-failover")
    epochs = 16
    total = epochs * STEPS_PER_EPOCH  # PS steps, one per minibatch
    kill_at = rng.randrange(20, total // 4)
    delete_at = rng.randrange(kill_at + 40, total // 2)
    print(f"master container SIGKILL at step {kill_at}, master pod deleted at {delete_at}")
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=2,
        epochs=epochs,
        minibatch_size=32,
        checkpoint_steps=40,
        record_ledger=True,
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )
    seen: list[int] = []
    follower = follow_events(job, seen)
    try:
        _kill_the_master_twice(job, core, real_node, job_namespace, kill_at, delete_at)
        final = job.wait(timeout=600)
    finally:
        close_forward(job)
    assert final["state"] == "succeeded", final.get("error")

    restarts = [e["data"] for e in _restarts(job)]
    assert [r["incarnation"] for r in restarts] == [1, 2]
    assert [r["adopted"] for r in restarts] == [3, 3]  # 2 workers and the PS, each time
    print("restarts:", [{k: r[k] for k in ("rebuild_s", "down_s", "adopted")} for r in restarts])
    # One unbroken journal, on the volume and as a follower of Job.events() saw it.
    follower.join(30)
    on_file = [e["seq"] for e in _journal(job)]
    assert on_file == list(range(len(on_file))), "the journal file has a gap or a repeat"
    assert seen == on_file, "the follower of Job.events() missed or repeated an event"
    events = list(job.events(follow=False))
    ended_early = [e.data for e in events if e.kind == "instance"
                   and e.data["kind"] in INSTANCE_ENDED and not e.data["expected"]]  # fmt: skip
    assert ended_early == [], "a worker or PS ended with a master"
    assert not [e for e in events if e.kind == "relaunch"]
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
