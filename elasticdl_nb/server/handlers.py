"""The HTTP handlers of the job API (see the package docstring for the routes).

Built on Jupyter's `APIHandler`: a request needs a logged-in user (token or cookie) whom
the server's authorizer allows `read` (GET) or `write` (PATCH, DELETE) on the
"elasticdl" resource; a cookie-authenticated PATCH or DELETE also needs the XSRF token;
a cross-origin request is refused. Errors are JSON, `{"message": ...}`. Calls that may
wait on a job's master run in a thread, so the server never blocks on a slow job.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from elasticdl_nb.backends import job_records as registry
from elasticdl_nb.sdk.job import Job
from elasticdl_nb.server.events_socket import EventsSocket
from elasticdl_nb.server.summary import job_detail, job_summary

RESOURCE = "elasticdl"
NAME = r"(?P<name>[a-z0-9][-a-z0-9]*)"


def find_job(name: str) -> tuple[Job, float]:
    """The job and its creation time; 404 if this machine knows no such job."""
    record = registry.find_job(name)
    if record is None:
        raise web.HTTPError(404, reason=f"no job named {name!r}")
    return Job(record), record.created


class JobsAPIHandler(APIHandler):
    auth_resource = RESOURCE

    def reply(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """`{"message": ...}`: the reason given, else the exception's own words."""
        reason = self._reason
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.reason:
            reason = exc.reason
        elif exc is not None and not isinstance(exc, web.HTTPError):
            reason = str(exc)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": reason}))


class JobListHandler(JobsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        namespace = self.get_argument("namespace", "")
        self.reply({"jobs": await asyncio.to_thread(_all_jobs, namespace)})


def _all_jobs(namespace: str) -> list[dict[str, Any]]:
    jobs = [job_summary(Job(record), record.created) for record in registry.all_jobs()]
    if namespace:  # Kubernetes jobs that other notebooks started there
        from elasticdl_nb.backends.kubernetes.find import list_jobs

        known = {j["name"] for j in jobs}
        for found in list_jobs(namespace):
            if found["name"] not in known:
                state = {"Running": "running", "Pending": "starting"}.get(found["phase"], "ended")
                jobs.append({"name": found["name"], "backend": "kubernetes", "state": state,
                             "remote": True})  # fmt: skip
    return jobs


class JobHandler(JobsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        job, created = find_job(name)
        self.reply(await asyncio.to_thread(job_detail, job, created))

    @web.authenticated
    @authorized
    async def patch(self, name: str) -> None:
        job, _ = find_job(name)
        try:
            workers = int(json.loads(self.request.body or b"{}")["workers"])
        except (ValueError, KeyError, TypeError):
            raise web.HTTPError(400, reason='send {"workers": N}, N a whole number') from None
        if workers < 0:
            raise web.HTTPError(400, reason=f"workers must be 0 or more, not {workers}")
        try:
            self.reply(await asyncio.to_thread(job.scale, workers))
        except ValueError as exc:  # not running: the SDK says why
            raise web.HTTPError(409, reason=str(exc)) from None

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        job, created = find_job(name)
        status = await asyncio.to_thread(job.stop)
        self.reply(job_summary(job, created, status))


class JobLogsHandler(JobsAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        job, _ = find_job(name)
        role = self.get_argument("role", "master")
        try:
            index = int(self.get_argument("index", "0"))
            tail = int(self.get_argument("tail", "200"))
            text = await asyncio.to_thread(job.logs, role, index, tail)
        except ValueError:
            raise web.HTTPError(400, reason="index and tail are whole numbers") from None
        except FileNotFoundError as exc:
            raise web.HTTPError(404, reason=str(exc)) from None
        self.reply({"role": role, "index": index, "text": text})


def routes(base_url: str) -> list[tuple[str, type]]:
    api = url_path_join(base_url, "elasticdl", "api", "jobs")
    return [
        (api, JobListHandler),
        (url_path_join(api, NAME), JobHandler),
        (url_path_join(api, NAME, "logs"), JobLogsHandler),
        (url_path_join(api, NAME, "events"), EventsSocket),
    ]
