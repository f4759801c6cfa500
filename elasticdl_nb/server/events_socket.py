"""`WS /elasticdl/api/jobs/{name}/events?from_seq=N[&namespace=NS]`: a job's journal from
sequence number N, one JSON message per event (`{"seq", "time", "kind", "data"}`), live
while the job runs; the server closes the socket once the journal has ended. A client
that lost its connection reconnects with `from_seq` = the last seq it saw + 1 and misses
nothing.

The job is found as every per-job route finds it (`attach`, see sdk_calls.py); its
journal is read by `Job.events`, which blocks, in a thread of its own; messages are
handed to the server's event loop. Authentication happens before the upgrade, as for
Jupyter's own websockets: a logged-in user allowed to `read` "elasticdl", same origin.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import ioloop, web, websocket

from elasticdl_nb.server.sdk_calls import find_job


class EventsSocket(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):
    auth_resource = "elasticdl"

    async def get(self, *args: Any, **kwargs: Any) -> None:
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "not logged in")
        if not self.authorizer.is_authorized(self, user, "read", self.auth_resource):
            raise web.HTTPError(403, "not allowed to read elasticdl jobs")
        try:
            self.from_seq = max(0, int(self.get_argument("from_seq", "0")))
        except ValueError:
            raise web.HTTPError(400, "from_seq is a whole number") from None
        self.job = await find_job(kwargs["name"], self.get_argument("namespace", ""))
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.closed = threading.Event()
        loop = ioloop.IOLoop.current()
        threading.Thread(
            target=self._relay, args=(loop,), daemon=True, name=f"edl-ws-{self.job.name}"
        ).start()

    def _relay(self, loop: ioloop.IOLoop) -> None:
        try:
            for event in self.job.events(self.from_seq):
                if self.closed.is_set():
                    return
                message = {"seq": event.seq, "time": event.time, "kind": event.kind,
                           "data": event.data}  # fmt: skip
                loop.add_callback(self._send, json.dumps(message))
        except Exception as exc:  # the job's master out of reach for good, a bad journal
            loop.add_callback(self._send, json.dumps({"kind": "error", "message": str(exc)}))
        loop.add_callback(self.close)

    def _send(self, text: str) -> None:
        if not self.closed.is_set():
            try:
                self.write_message(text)
            except websocket.WebSocketClosedError:
                self.closed.set()

    def on_close(self) -> None:
        self.closed.set()
