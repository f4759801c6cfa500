"""The Jupyter server extension: every job this machine knows, over authenticated HTTP and
a websocket, for the JupyterLab sidebar (labextension/) and any other client. It reads
and steers jobs through the SDK only (`jobs`, `attach`, `Job`), so it shows what a
notebook would.

    GET    /elasticdl/api/jobs                 {"jobs": [...], "final_states": [...]}: the
                                               jobs (state, progress, counts) and the states
                                               after which a job changes no more
    GET    /elasticdl/api/jobs/{name}          one job in detail (instances, metrics)
    PATCH  /elasticdl/api/jobs/{name}          {"workers": N}: scale
    DELETE /elasticdl/api/jobs/{name}          stop
    GET    /elasticdl/api/jobs/{name}/logs     ?role=worker&index=0&tail=200
    WS     /elasticdl/api/jobs/{name}/events   ?from_seq=N: the journal, live

Every route takes `?namespace=NS`: the list then also holds the Kubernetes jobs there
that other notebooks started (`"remote": true`), and a per-job route finds such a job by
its labels (the server's kubeconfig: $KUBECONFIG or ~/.kube/config). Errors are
`{"message": ...}` with the SDK's words: no such job or log 404, not this account's (a
namespace the cluster refuses it, another user's job home) 403, a bad request 400, a
scale of a job that is not running 409.

Enabled on install (jupyter-config/ in the wheel); every handler requires Jupyter's
authentication and authorization, and the state-changing ones its XSRF protection.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "elasticdl_nb.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from elasticdl_nb.server.handlers import routes

    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", routes(base))
    serverapp.log.info("elasticdl-nb: job API at %selasticdl/api/jobs", base)
