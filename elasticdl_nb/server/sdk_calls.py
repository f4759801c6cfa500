"""The server extension's one way into the SDK, as dask-labextension's handlers go through
one manager: jobs are listed with `jobs`, found with `attach`, and steered with `Job`'s
methods, so the API shows what a notebook or the CLI would.

Every call runs in a thread (the SDK waits on masters and on the cluster; the server must
not). An error the SDK raises for a user to act on becomes an HTTP answer carrying its
message; anything else is our bug and stays a 500 with its traceback in the server's log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from tornado import web

from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.sdk import Job, attach

T = TypeVar("T")


def http_error(exc: BaseException, invalid: int = 400) -> web.HTTPError | None:
    """The answer to an SDK error: no such job or file 404, not this account's to see 403
    (another user's job home, a namespace the cluster refuses it), a bad value `invalid`
    (400, or 409 where it means the job's state forbids the call), any other user error
    400; None for an error that is ours. The message is the SDK's own words."""
    if isinstance(exc, LookupError | FileNotFoundError):
        return web.HTTPError(404, "%s", exc)
    if isinstance(exc, PermissionError) and isinstance(exc, ElasticDLError):
        return web.HTTPError(403, "%s", exc)
    if isinstance(exc, ValueError):
        return web.HTTPError(invalid, "%s", exc)
    if isinstance(exc, ElasticDLError):
        return web.HTTPError(400, "%s", exc)
    return None


async def call(function: Callable[..., T], *args: Any, invalid: int = 400) -> T:
    """`function(*args)` in a thread, its user errors as HTTP errors (see `http_error`)."""
    try:
        return await asyncio.to_thread(function, *args)
    except Exception as exc:
        error = http_error(exc, invalid)
        if error is None:
            raise
        raise error from None


async def find_job(name: str, namespace: str = "") -> Job:
    """The job `name` as `attach` finds it: known here, or with `namespace`, a Kubernetes
    job there that another notebook started (found by its labels); 404 if neither."""
    return await call(attach, name, namespace or None)
