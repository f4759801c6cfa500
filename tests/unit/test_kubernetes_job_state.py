"""A Kubernetes job's state read from its master's Job, master pod and job directory: the
one reading that `Job.status()` and `jobs(namespace=)` both go by."""

from __future__ import annotations

import json

import pytest

from elasticdl_nb.backends.kubernetes.job_state import current_pod, job_dir_of, job_state
from elasticdl_nb.runtime.job_dir import JobDir, write_json

ENDED = {"name": "j", "state": "succeeded", "error": "", "epoch": 2}
JOB = {"metadata": {"name": "j-master"}, "status": {}}


def job(*conditions: str) -> dict:
    return {**JOB, "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}}


def pod(phase: str, ready: bool = False, terminated: dict | None = None) -> dict:
    container = {"state": {"terminated": {"exitCode": 0, "message": json.dumps(terminated)}}}
    return {
        "metadata": {"name": "j-master-abc", "creationTimestamp": "2026-12-03T10:00:00Z"},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container] if terminated else [{"state": {"running": {}}}],
        },
    }


@pytest.mark.parametrize(
    "the_job, the_pod, expected",
    [
        (job(), None, "starting"),  # the Job's pod not made yet
        (job(), pod("Pending"), "starting"),
        (job(), pod("Running"), "starting"),  # not serving yet
        (job(), pod("Running", ready=True), "running"),
        # The master recorded the end and exited; the Job completes a moment later.
        (job(), pod("Succeeded", terminated=ENDED), "succeeded"),
        (job("Complete"), pod("Succeeded", terminated=ENDED), "succeeded"),
        (job("Complete"), None, "ended"),  # its pod gone: the end cannot be read
        (job("Failed"), pod("Failed"), "lost"),
        (None, None, "lost"),  # the Job deleted
        (None, pod("Running", ready=True), "running"),  # its master is stopping the job
    ],
)
def test_the_state_of_a_job_from_its_job_and_master_pod(the_job, the_pod, expected):
    assert job_state("j", "ns", the_job, the_pod, None).state == expected


def test_an_end_recorded_on_a_visible_volume_counts_before_the_pod_says_it_ended(tmp_path):
    serving = pod("Running", ready=True)
    assert job_state("j", "ns", job(), serving, tmp_path).state == "running"
    write_json(JobDir(tmp_path).state, ENDED)  # the master's last write, then it exits
    reading = job_state("j", "ns", job(), serving, tmp_path)
    assert (reading.state, reading.final) == ("succeeded", ENDED)


def test_an_end_that_cannot_be_read_says_so():
    reading = job_state("j", "ns", job("Complete"), None, None)
    assert reading.final["state"] == "ended"
    assert (
        "kubectl logs -n ns -l elasticdl-nb/job=j,elasticdl-nb/role=master"
        in (reading.final["error"])
    )


def test_the_master_pod_that_counts_is_the_newest_not_being_deleted():
    old, new, going = pod("Running"), pod("Pending"), pod("Running")
    old["metadata"]["creationTimestamp"] = "2026-12-03T09:00:00Z"
    going["metadata"].update(creationTimestamp="2026-12-03T11:00:00Z", deletionTimestamp="x")
    assert current_pod([old, going, new]) is new
    assert current_pod([going]) is going
    assert current_pod([]) is None


def test_the_job_directory_is_read_where_its_host_path_volume_is_here(tmp_path):
    def master_job(volume: dict) -> dict:
        return {"spec": {"template": {"spec": {"volumes": [{"name": "job", **volume}]}}}}

    assert job_dir_of(master_job({"hostPath": {"path": str(tmp_path)}}), "j") == tmp_path / "j"
    assert job_dir_of(master_job({"hostPath": {"path": str(tmp_path / "no")}}), "j") is None
    assert job_dir_of(master_job({"persistentVolumeClaim": {"claimName": "c"}}), "j") is None
