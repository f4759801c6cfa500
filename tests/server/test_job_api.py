"""The job API of the server extension against real local jobs and a real Jupyter server:
list (with the final states), detail, scale, stop and logs; the events websocket resuming
from a sequence number; the SDK's errors as HTTP codes with its words; and requests that
are refused (not logged in, cross-site, no XSRF token, bad input)."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

import elasticdl_nb as edl
from elasticdl_nb.vocabulary import FINAL_STATES
from tests.integration.faults import wait_for_step
from tests.integration.models import DIGITS, digits_job

pytestmark = pytest.mark.slow


def _paced_loss(labels, predictions):
    """The digits loss with each step taking at least 30 ms: the job is still running
    while the test scales it."""
    import time

    import tensorflow as tf

    pause = tf.py_function(lambda: (time.sleep(0.03), 0.0)[1], [], tf.float32)
    return DIGITS["loss"](labels, predictions) + 0.0 * tf.reshape(pause, [])


async def fetch_json(jp_fetch, *path, **kwargs):
    response = await jp_fetch("elasticdl", "api", "jobs", *path, **kwargs)
    return json.loads(response.body)


async def poll(check, timeout: float, what: str):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def test_list_detail_scale_and_stop_a_real_job(jp_fetch, job_home):
    job, _, _ = digits_job(workers=1, epochs=30, loss=_paced_loss)
    await asyncio.to_thread(wait_for_step, job, 5)

    reply = await fetch_json(jp_fetch)
    assert reply["final_states"] == ["ended", "failed", "lost", "stopped", "succeeded"]
    assert set(reply["final_states"]) == FINAL_STATES  # the vocabulary's, not a copy
    listed = reply["jobs"]
    assert [j["name"] for j in listed] == [job.name]
    summary = listed[0]
    assert summary["backend"] == "local" and summary["state"] == "running"
    assert 0 < summary["progress"]["fraction"] < 1 and summary["progress"]["epochs"] == 30
    workers = summary["workers"]
    assert (workers["live"], workers["desired"], workers["min"], workers["pending"]) == (1, 1, 0, 0)
    assert summary["ps"] == 1
    assert summary["created"] == edl.jobs()[0]["created"] and summary["remote"] is False

    detail = await fetch_json(jp_fetch, job.name)
    assert {(i["role"], i["id"]) for i in detail["instances"]} >= {("ps", 0), ("worker", 0)}

    logs = await fetch_json(jp_fetch, job.name, "logs", params={"role": "worker", "tail": "5"})
    assert logs["role"] == "worker" and logs["index"] == 0 and logs["text"]
    with pytest.raises(HTTPClientError) as missing:  # Job.logs: FileNotFoundError
        await fetch_json(jp_fetch, job.name, "logs", params={"role": "worker", "index": "9"})
    assert missing.value.code == 404
    with pytest.raises(FileNotFoundError) as sdk:
        job.logs("worker", 9)
    assert json.loads(missing.value.response.body) == {"message": str(sdk.value)}
    with pytest.raises(HTTPClientError) as bad:  # Job.logs: ValueError
        await fetch_json(jp_fetch, job.name, "logs", params={"role": "chief"})
    assert bad.value.code == 400
    assert json.loads(bad.value.response.body)["message"].startswith("No role 'chief'")

    with pytest.raises(HTTPClientError) as bad:
        await fetch_json(jp_fetch, job.name, method="PATCH", body='{"workers": "x"}')
    assert bad.value.code == 400
    assert json.loads(bad.value.response.body)["message"] == (
        'send {"workers": N} or {"workers": "MIN:MAX"}, whole numbers'
    )
    body = json.dumps({"workers": "1:3"})  # a range: the sidebar keeps a job's MIN
    scaled = await fetch_json(jp_fetch, job.name, method="PATCH", body=body)
    assert scaled == {"workers_from": 1, "workers_to": 3, "min_workers": 1}

    async def three_live():
        return (await fetch_json(jp_fetch, job.name))["workers"]["live"] == 3

    await poll(three_live, 120, "3 live workers")

    stopped = await fetch_json(jp_fetch, job.name, method="DELETE")
    assert stopped["state"] == "stopped"
    assert (await fetch_json(jp_fetch))["jobs"][0]["state"] == "stopped"
    with pytest.raises(HTTPClientError) as over:  # Job.scale on a stopped job: ValueError
        await fetch_json(jp_fetch, job.name, method="PATCH", body=json.dumps({"workers": 2}))
    assert over.value.code == 409
    assert "its master is not running" in json.loads(over.value.response.body)["message"]


async def test_a_job_nobody_knows_is_a_404_in_the_sdk_s_words(
    jp_fetch, jp_ws_fetch, job_home, monkeypatch
):
    with pytest.raises(LookupError) as sdk:
        edl.attach("no-such-job")
    for method, path, body in [
        ("GET", (), None),
        ("PATCH", (), '{"workers": 1}'),
        ("DELETE", (), None),
        ("GET", ("logs",), None),
    ]:
        with pytest.raises(HTTPClientError) as missing:
            await fetch_json(jp_fetch, "no-such-job", *path, method=method, body=body)
        assert missing.value.code == 404, (method, path)
        assert json.loads(missing.value.response.body) == {"message": str(sdk.value)}
    with pytest.raises(HTTPClientError) as missing:
        await jp_ws_fetch("elasticdl", "api", "jobs", "no-such-job", "events")
    assert missing.value.code == 404

    # With a namespace the cluster is asked too; a cluster it cannot reach is the
    # user's to fix (an ElasticDLError): 400, with the SDK's fix.
    monkeypatch.setenv("KUBECONFIG", str(job_home / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for path in [(), ("no-such-job",)]:
        with pytest.raises(HTTPClientError) as refused:
            await fetch_json(jp_fetch, *path, params={"namespace": "ml"})
        assert refused.value.code == 400, path
        message = json.loads(refused.value.response.body)["message"]
        assert message.startswith(f"No kubeconfig at {job_home / 'no-kubeconfig'}"), message


async def test_the_events_websocket_resumes_from_a_sequence_number(jp_fetch, jp_ws_fetch, job_home):
    job, _, _ = digits_job(workers=1, epochs=1)
    await asyncio.to_thread(job.wait, 240, False)

    async def read_all(from_seq: int) -> list[dict]:
        socket = await jp_ws_fetch(
            "elasticdl", "api", "jobs", job.name, "events", params={"from_seq": str(from_seq)}
        )
        messages = []
        while (text := await socket.read_message()) is not None:  # None: the server closed
            messages.append(json.loads(text))
        return messages

    everything = await read_all(0)
    assert [m["seq"] for m in everything] == list(range(len(everything)))
    states = [m["data"]["state"] for m in everything if m["kind"] == "job_state"]
    assert states[-1] == "succeeded"  # the whole journal, to its end
    resumed = await read_all(10)
    assert resumed == everything[10:]


async def test_refused_not_logged_in_cross_site_and_without_xsrf(
    jp_fetch, jp_base_url, jp_http_port, jp_serverapp, job_home
):  # jp_fetch: its fixture is what makes the server listen
    url = f"http://localhost:{jp_http_port}{jp_base_url}elasticdl/api/jobs"
    client = AsyncHTTPClient()

    with pytest.raises(HTTPClientError) as refused:  # no token, no cookie
        await client.fetch(url)
    assert refused.value.code == 403
    with pytest.raises(HTTPClientError) as refused:  # nor may the websocket be opened
        await _ws_without_token(jp_http_port, jp_base_url)
    assert refused.value.code == 403

    # A browser holding the logged-in user's cookie (not the token)...
    token = jp_serverapp.identity_provider.token
    login = await client.fetch(f"{url}?token={token}")
    cookies = "; ".join(c.split(";")[0] for c in login.headers.get_list("Set-Cookie"))
    assert "username-" in cookies
    same_site = await client.fetch(url, headers={"Cookie": cookies})
    assert "jobs" in json.loads(same_site.body)
    # ...on another site's page: not served.
    with pytest.raises(HTTPClientError) as refused:
        await client.fetch(url, headers={"Cookie": cookies, "Origin": "http://evil.example"})
    assert refused.value.code == 404

    # A cookie-authenticated state change needs the XSRF token as well.
    with pytest.raises(HTTPClientError) as refused:
        await client.fetch(f"{url}/no-such-job", method="DELETE", headers={"Cookie": cookies})
    assert refused.value.code == 403
    xsrf = "the-xsrf-token"
    with pytest.raises(HTTPClientError) as missing:  # past the XSRF check, then: no such job
        await client.fetch(
            f"{url}/no-such-job",
            method="DELETE",
            headers={"Cookie": f"{cookies}; _xsrf={xsrf}", "X-XSRFToken": xsrf},
        )
    assert missing.value.code == 404
    with pytest.raises(LookupError) as sdk:
        edl.attach("no-such-job")
    assert json.loads(missing.value.response.body) == {"message": str(sdk.value)}


async def _ws_without_token(port: int, base_url: str):
    from tornado.websocket import websocket_connect

    return await websocket_connect(f"ws://localhost:{port}{base_url}elasticdl/api/jobs/x/events")


def test_what_is_not_this_accounts_to_see_is_a_403_in_the_sdk_s_words():
    """Another user's job home (locally), a namespace the cluster refuses this account:
    403 with the SDK's message (the real server in a notebook pod answers so:
    tests/kubernetes/test_two_namespaces.py); a plain OSError is ours, a 500."""
    from elasticdl_nb.backends.job_records import JobNotYours
    from elasticdl_nb.backends.kubernetes.api import KubernetesForbidden
    from elasticdl_nb.server.sdk_calls import http_error

    for refused in (JobNotYours("not yours"), KubernetesForbidden("forbidden")):
        error = http_error(refused)
        assert error.status_code == 403 and error.log_message % error.args == str(refused)
    assert http_error(PermissionError("disk")) is None
