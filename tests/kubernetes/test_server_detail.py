"""The server extension of another notebook shows a Kubernetes job it did not start: its
job home knows nothing of the job, and given `?namespace=` the list holds it (found by
its labels) and the job's detail view, found the same way, has its instances and progress.
The job keeps its files on a claim (`pvc:`) that no notebook here sees, so the logs in
the SDK and the sidebar come from the pods, through the API server (`pods/log`).

The Jupyter server runs in the test process (pytest-jupyter's `jp_fetch`, as in
tests/server/); its fixtures are imported here, for this module only. The test body is
synchronous (the job is started and waited for as a notebook would) and runs each request
on the server's event loop.
"""

from __future__ import annotations

import json

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403  (fixtures: jp_fetch and its own)
from tornado.httpclient import HTTPClientError

import elasticdl_nb as edl
from tests.integration.faults import wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split, paced_loss
from tests.kubernetes.job_pods import claim_on_node, k8s_options

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

EPOCHS = 20  # ~45 s of 50 ms steps: still training while the server is asked; stopped after


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"elasticdl_nb.server": True}}}


def test_a_kubernetes_job_from_another_notebook_is_listed_and_has_a_detail_view(
    job_home,
    job_namespace,
    real_cluster,
    real_admin,
    tmp_path,
    monkeypatch,
    jp_fetch,
    jp_asyncio_loop,
):
    (x, y), _ = digits_split()
    claim = claim_on_node(real_admin, job_namespace, tmp_path)
    options = {
        **k8s_options(real_cluster, job_namespace, tmp_path),
        "shared_volume": f"pvc:{claim}",
    }
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": paced_loss},
        data=(x, y),
        workers=1,
        epochs=EPOCHS,
        minibatch_size=32,
        **options,
    )
    wait_for_step(job, 5, timeout=300)
    # The notebook that started it does not see its files: logs come from the pods.
    assert not job.dir.joinpath("logs").is_dir()
    assert f"worker 0 of job {job.name} started" in job.logs("worker", 0)
    assert f"master of {job.name} serving on" in job.logs("master", tail=50)
    started = edl.jobs()[0]["created"]

    def get(*path: str, **kwargs) -> dict:
        request = jp_fetch("elasticdl", "api", "jobs", *path, **kwargs)
        return json.loads(jp_asyncio_loop.run_until_complete(request).body)

    where = {"params": {"namespace": job_namespace}}
    with monkeypatch.context() as another_notebook:  # its own job home, the user's kubeconfig
        another_notebook.setenv("ELASTICDL_NB_HOME", str(tmp_path / "another-notebook"))
        another_notebook.setenv("KUBECONFIG", str(real_cluster.user_kubeconfig))

        assert get()["jobs"] == []
        with pytest.raises(HTTPClientError) as unknown:
            get(job.name)
        assert unknown.value.code == 404
        assert "pass namespace=" in json.loads(unknown.value.response.body)["message"]

        listed = get(**where)["jobs"]
        assert [(j["name"], j["backend"], j["state"], j["remote"]) for j in listed] == [
            (job.name, "kubernetes", "running", True)
        ]
        assert abs(listed[0]["created"] - started) < 120  # the master pod's creation time

        detail = get(job.name, **where)
        assert (detail["name"], detail["backend"], detail["state"]) == (
            job.name,
            "kubernetes",
            "running",
        )
        assert {(i["role"], i["id"]) for i in detail["instances"]} >= {("ps", 0), ("worker", 0)}
        progress = detail["progress"]
        assert progress["epochs"] == EPOCHS and progress["step"] >= 5
        assert 0 < progress["fraction"] < 1
        # A fixed count: no range, nothing pending, training waits for no one.
        assert detail["workers"] == {
            "live": 1,
            "desired": 1,
            "min": 0,
            "pending": 0,
            "pending_reason": "",
            "waiting": "",
            "growth": "",
        }
        assert detail["ps"] == 1
        logs = get(job.name, "logs", params={"namespace": job_namespace, "role": "worker"})
        assert f"worker 0 of job {job.name} started" in logs["text"]

        stopped = get(job.name, method="DELETE", **where)
        assert stopped["state"] == "stopped"
    assert job.status()["state"] == "stopped"  # the notebook that started it sees it too
    # The master removed the worker's pod, and its log with it; the master's pod stays.
    with pytest.raises(edl.NoSuchLog, match="its log directory is not visible here"):
        job.logs("worker", 0)
    assert "master exits" in job.logs("master")
