"""The HTTP handlers of the job API (see the package docstring for the routes).

Thin, as dask-labextension's are: each handler parses its request and makes one SDK call
through `sdk_calls` (which also turns the SDK's errors into HTTP codes). A per-job route
finds its job with `attach(name, namespace)`, so a Kubernetes job that another notebook
started has every view a local one has, given `?namespace=`.

Built on Jupyter's `APIHandler`: a request needs a logged-in user (token or cookie) whom
the server's authorizer allows `read` (GET) or `write` (PATCH, DELETE) on the
"elasticdl" resource; a cookie-authenticated PATCH or DELETE also needs the XSRF token;
a cross-origin request is refused. Errors are JSON, `{"message": ...}`.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from elasticdl_nb.sdk import attach, jobs
from elasticdl_nb.server.events_socket import EventsSocket
from elasticdl_nb.server.sdk_calls import call, find_job
from elasticdl_nb.server.summary import VIEWS, job_detail, job_summary, remote_summary
from elasticdl_nb.spec import SpecError, worker_range
from elasticdl_nb.vocabulary import FINAL_STATES

RESOURCE = "elasticdl"
NAME = r"(?P<name>[a-z0-9][-a-z0-9]*)"


class JobsAPIHandler(APIHandler):
    auth_resource = RESOURCE

    @property
    def namespace(self) -> str:
        """`?namespace=`: also the Kubernetes jobs there that other notebooks started."""
        return self.get_argument("namespace", "")

    def reply(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """`{"message": ...}`: the error's own words, else the status's phrase."""
        message = self._reason
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.get_message()
        elif exc is not None and not isinstance(exc, web.HTTPError):
            message = str(exc)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))


class JobListHandler(JobsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        listed = await call(_summaries, self.namespace)
        self.reply({"jobs": listed, "final_states": sorted(FINAL_STATES)})


def _summaries(namespace: str) -> list[dict[str, Any]]:
    out, attached = [], []
    for listed in jobs(namespace or None):
        if listed["remote"]:  # nothing more to say without attaching to it
            out.append(remote_summary(listed))
            continue
        try:
            job = attach(listed["name"])
        except LookupError:
            continue  # deleted since it was listed
        attached.append(job)
        out.append(job_summary(job))
    VIEWS.keep_only(attached)
    return out


class JobHandler(JobsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        job = await find_job(name, self.namespace)
        self.reply(await call(job_detail, job))

    @web.authenticated
    @authorized
    async def patch(self, name: str) -> None:
        job = await find_job(name, self.namespace)
        try:
            workers = json.loads(self.request.body or b"{}")["workers"]
            low, high = worker_range(workers if isinstance(workers, str) else int(workers))
        except (ValueError, KeyError, TypeError, SpecError):
            raise web.HTTPError(
                400, 'send {"workers": N} or {"workers": "MIN:MAX"}, whole numbers'
            ) from None
        if high < 0:
            raise web.HTTPError(400, "workers must be 0 or more, not %d", high)
        asked = high if low is None else f"{low}:{high}"
        # A ValueError here is the job's state (not running): the SDK says why.
        self.reply(await call(job.scale, asked, invalid=409))

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        job = await find_job(name, self.namespace)
        status = await call(job.stop)
        self.reply(job_summary(job, status))


class JobLogsHandler(JobsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        job = await find_job(name, self.namespace)
        role = self.get_argument("role", "master")
        try:
            index = int(self.get_argument("index", "0"))
            tail = int(self.get_argument("tail", "200"))
        except ValueError:
            raise web.HTTPError(400, "index and tail are whole numbers") from None
        text = await call(job.logs, role, index, tail)
        self.reply({"role": role, "index": index, "text": text})


def routes(base_url: str) -> list[tuple[str, type]]:
    api = url_path_join(base_url, "elasticdl", "api", "jobs")
    return [
        (api, JobListHandler),
        (url_path_join(api, NAME), JobHandler),
        (url_path_join(api, NAME, "logs"), JobLogsHandler),
        (url_path_join(api, NAME, "events"), EventsSocket),
    ]
