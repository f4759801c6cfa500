"""A Kubernetes job at its end, on the real node, as the notebook that started it and another
notebook see it: `status()` of an ended job answers at once from what the end left (the
final state on the job's volume, or the master pod's termination message) without a try
to reach the gone master, and `jobs(namespace=)` says the state `status()` says at every
moment from the end until the Job has completed (both read `job_state`)."""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest

import elasticdl_nb as edl
from elasticdl_nb.sdk.job import Job
from elasticdl_nb.vocabulary import MASTER_END_STATES, EventKind
from tests.integration.models import DIGITS, custom_model, digits_split
from tests.kubernetes.job_pods import close_forward, k8s_options

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


def test_an_ended_job_answers_status_at_once_and_jobs_says_what_status_says_throughout_its_end(
    job_home, job_namespace, real_cluster, real_admin, tmp_path, monkeypatch, caplog, capfd
):
    from kubernetes import client

    batch = client.BatchV1Api(real_admin)
    options = k8s_options(real_cluster, job_namespace, tmp_path)
    (x, y), _ = digits_split()
    job = edl.train(custom_model, **DIGITS, data=(x, y), workers=1, epochs=1, **options)
    elsewhere = tmp_path / "another-notebook"  # its own job registry: finds jobs by label

    def listed() -> str:
        with monkeypatch.context() as env:
            env.setenv("ELASTICDL_NB_HOME", str(elsewhere))
            found = {j["name"]: j for j in edl.jobs(job_namespace, options["kubeconfig"])}
        assert found[job.name]["remote"], found[job.name]
        return found[job.name]["state"]

    def completed() -> bool:
        conditions = batch.read_namespaced_job(f"{job.name}-master", job_namespace).status
        return any(c.type == "Complete" and c.status == "True" for c in conditions.conditions or [])

    def timed_status() -> tuple[dict, float]:
        t0 = time.monotonic()
        status = job.status()
        return status, time.monotonic() - t0

    try:
        events = job.events(timeout=900)  # a stream through the port-forward
        for event in events:
            if event.kind == EventKind.JOB_STATE and event.data["state"] in MASTER_END_STATES:
                break
        events.close()
        caplog.set_level(logging.INFO, logger="elasticdl_nb")
        capfd.readouterr()

        # From the end the master decided until its Job completed, and a little beyond:
        # the master stops its workers and PS, records the end and exits, the kubelet
        # reports it, the Job controller completes the Job.
        seen, slowest, disagreements = [], 0.0, []
        deadline, complete_since = time.monotonic() + 300, None
        while complete_since is None or time.monotonic() < complete_since + 3:
            assert time.monotonic() < deadline, f"the Job did not complete in 300 s: {seen}"
            before, took = timed_status()
            in_list = listed()
            after, took_after = timed_status()
            slowest = max(slowest, took, took_after)
            states = (str(before["state"]), str(in_list), str(after["state"]))
            if in_list not in (before["state"], after["state"]) and states not in disagreements:
                disagreements.append(states)
            if not seen or seen[-1] != states:
                seen.append(states)
            if complete_since is None and completed():
                complete_since = time.monotonic()
        with capfd.disabled():
            print(f"\nstatus, jobs, status from the end: {seen}; slowest {slowest:.2f} s")
        assert disagreements == [], f"jobs() said another state than status(): {disagreements}"
        assert seen[-1] == ("succeeded", "succeeded", "succeeded"), seen

        # An ended job answers at once, and nothing tried to reach its gone master.
        assert slowest < 6, f"a status() took {slowest:.1f} s from the end on"
        status, took = timed_status()
        assert status["state"] == "succeeded" and took < 3, (status, took)
        # Where the job's volume is not visible: from the master pod's termination message.
        unseen = Job(dataclasses.replace(job._record, where={**job._record.where, "files": ""}))
        t0 = time.monotonic()
        assert unseen.status()["state"] == "succeeded"
        assert time.monotonic() - t0 < 3
        noise = [r.getMessage() for r in caplog.records if "port-forward" in r.getMessage()]
        noise += [line for line in capfd.readouterr().err.splitlines() if "port-forward" in line]
        assert noise == [], noise
    finally:
        close_forward(job)
