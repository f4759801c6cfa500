"""A notebook server in a pod (deploy/notebook.yaml), for the tests of the notebook
inside the cluster (issue 36): made in a namespace as an admin would make it, reached as
its user reaches it (a port-forward through the API server, Jupyter's token), and its
kernels driven as a notebook's cells drive them (Jupyter's REST API and kernel
websocket)."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.conftest import REPO
from tests.integration.faults import wait_for
from tests.kubernetes.access import wait_for_account_token
from tests.kubernetes.job_pods import SMALL

NOTEBOOK = "elasticdl-nb-notebook"
PORT = 8888
ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # the in-cluster identity


NOTEBOOK_IMAGE = "elasticdl-nb-notebook:0.1.0"  # as deploy/notebook.yaml names it


def notebook_documents() -> list[dict]:
    """deploy/notebook.yaml, as it ships."""
    text = (REPO / "deploy" / "notebook.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def volume_for(core, namespace: str, claim: str, where) -> None:
    """A hostPath PersistentVolume reserved for `claim` (the test cluster has no storage
    provisioner): what a cluster's storage class would make."""
    where.mkdir(exist_ok=True)
    where.chmod(0o777)  # hostPath ignores fsGroup: every user's uid makes its own here
    core.create_persistent_volume(
        {
            "metadata": {"name": f"{namespace}-{claim}"},
            "spec": {
                "capacity": {"storage": "20Gi"},
                "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "claimRef": {"namespace": namespace, "name": claim},
                "hostPath": {"path": str(where), "type": "Directory"},
            },
        }
    )


class Notebook:
    def __init__(self, namespace: str, url: str, token: str):
        self.namespace, self.url, self.token = namespace, url, token
        self.volumes: Path | None = None  # where its claims' hostPath volumes are

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        """GET `path` from the notebook server with `token` (its own by default)."""
        request = urllib.request.Request(f"{self.url}{path}")
        if token is None:
            token = self.token
        if token:
            request.add_header("Authorization", f"token {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def put(self, path: str, notebook_json: str) -> None:
        """Write a notebook into the server's root (Jupyter's contents API)."""
        body = {"type": "notebook", "format": "json", "content": json.loads(notebook_json)}
        request = urllib.request.Request(
            f"{self.url}/api/contents/{path}",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status in (200, 201), reply.status


@contextlib.contextmanager
def notebook_pod(
    node, admin, namespace: str, volumes: Path, run_as: tuple[int, int] | None = None
) -> Iterator[Notebook]:
    """deploy/notebook.yaml applied in `namespace` (set up for jobs already), its
    claims bound to hostPath volumes under `volumes` (`volumes`/jobs may be shared with
    other namespaces: a storage export several users' claims reach), the pod Ready, as
    `run_as` (uid, gid) where given, as an admin gives each user a uid of their own; a
    port-forward to it as the notebook's user."""
    from kubernetes import client, utils

    from elasticdl_nb.backends.kubernetes.api import client_for
    from elasticdl_nb.backends.kubernetes.port_forward import PortForward, pod_stream_opener

    seconds = node.ensure_image("NOTEBOOK", NOTEBOOK_IMAGE)
    if seconds:
        print(f"\nnotebook image imported into the node in {seconds:.1f} s")
    core = client.CoreV1Api(admin)
    token = secrets.token_hex(24)
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": NOTEBOOK}, "stringData": {"token": token}}
    )
    claims = {"elasticdl-nb-jobs": volumes / "jobs", "elasticdl-nb-home": volumes / namespace}
    for claim, where in claims.items():
        volume_for(core, namespace, claim, where)
    t0 = time.monotonic()
    for document in notebook_documents():
        if document["kind"] == "Pod":
            wait_for_account_token(admin, namespace, document["spec"]["serviceAccountName"])
        if document["kind"] == "Pod" and run_as:
            context = document["spec"]["securityContext"]
            context.update(runAsUser=run_as[0], runAsGroup=run_as[1], fsGroup=run_as[1])
        if document["kind"] == "ConfigMap":  # the test node's two cores hold small pods
            document["data"]["ipython_config.py"] += "".join(
                f"c.ElasticDL.{role}_resources = {SMALL!r}\n" for role in ("master", "ps", "worker")
            )
        utils.create_from_dict(admin, document, namespace=namespace)

    def ready() -> bool:
        pod = core.read_namespaced_pod(NOTEBOOK, namespace)
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
        return conditions.get("Ready") == "True"

    try:
        wait_for(ready, 180, "the notebook pod to be Ready")
    except (AssertionError, TimeoutError):
        pod = core.read_namespaced_pod(NOTEBOOK, namespace)
        print(pod.status, core.read_namespaced_pod_log(NOTEBOOK, namespace, tail_lines=60))
        raise
    print(f"\nnotebook pod Ready {time.monotonic() - t0:.1f} s after it was applied")
    # The user's way in: a port-forward as the notebook's user (the user Role grants it).
    streams = client.CoreV1Api(client_for(str(node.cluster.user_kubeconfig)))
    forward = PortForward(pod_stream_opener(streams, NOTEBOOK, namespace, PORT))
    try:
        notebook = Notebook(namespace, f"http://{forward.address}", token)
        notebook.volumes = volumes
        yield notebook
    finally:
        forward.close()
        for claim in claims:
            core.delete_persistent_volume(f"{namespace}-{claim}")


def run_in_kernel(notebook: Notebook, cells: list[str], timeout: float = 600) -> list[str]:
    """Run `cells` one after the other in a new kernel of the notebook server, as a
    notebook's cells run (Jupyter's REST API and its kernel websocket); each one's output
    (stdout, results, tracebacks)."""
    import uuid

    import websocket  # (websocket-client: the kubernetes client's own dependency)

    request = urllib.request.Request(
        f"{notebook.url}/api/kernels",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"token {notebook.token}"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        kernel = json.loads(reply.read())["id"]
    ws = websocket.create_connection(
        f"{notebook.url.replace('http', 'ws')}/api/kernels/{kernel}/channels",
        header=[f"Authorization: token {notebook.token}"],
        timeout=timeout,
    )
    session, outputs = uuid.uuid4().hex, []
    deadline = time.monotonic() + timeout
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            header = {
                "msg_id": msg_id,
                "username": "test",
                "session": session,
                "msg_type": "execute_request",
                "version": "5.3",
            }
            content = {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
            }
            ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {},
                                "content": content, "channel": "shell"}))  # fmt: skip
            out = []
            while True:
                assert time.monotonic() < deadline, f"cells not done in {timeout} s: {outputs}"
                msg = json.loads(ws.recv())
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    out.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    out.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    out.append("\n".join(content["traceback"]))
                elif kind == "status" and content["execution_state"] == "idle":
                    break
            outputs.append("".join(out))
        return outputs
    finally:
        ws.close()


def quickstart_cells() -> list[str]:
    """The quickstart notebook's code cells, as it ships."""
    notebook = json.loads((REPO / "examples" / "quickstart.ipynb").read_text())
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
