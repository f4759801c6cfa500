"""The notebook inside the cluster (issue 36): deploy/notebook.yaml applied to a namespace
as an admin would (after deploy/rbac.yaml), the notebook pod on the real node, reached
from outside the pod network through a port-forward via the API server, as its user
reaches it (notebook_pod.py).

It runs the jobs' image (deploy/Dockerfile carries JupyterLab for it), as a non-root
user, under a service account bound to the user Role alone, with no kubeconfig: what its
kernels may do in the cluster is that Role.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from tests.kubernetes.notebook_pod import (
    ACCOUNT_MOUNT,
    NOTEBOOK,
    notebook_pod,
)

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


@pytest.fixture(scope="module")
def notebook(real_cluster, real_admin, real_node, tmp_path_factory):
    """The notebook pod of a fresh namespace set up for jobs, Ready."""
    from tests.kubernetes.conftest import _namespace
    from tests.kubernetes.node_session import set_up_for_jobs

    namespaces = _namespace(real_cluster, real_admin)
    namespace = next(namespaces)
    set_up_for_jobs(real_cluster, real_admin, namespace)
    volumes = tmp_path_factory.mktemp("notebook-volumes")
    with notebook_pod(real_node, real_admin, namespace, volumes) as notebook:
        yield notebook
    next(namespaces, None)


def test_the_notebook_pod_runs_as_a_non_root_user_under_its_own_service_account(
    notebook, real_admin
):
    from kubernetes import client

    pod = client.CoreV1Api(real_admin).read_namespaced_pod(NOTEBOOK, notebook.namespace)
    assert pod.spec.service_account_name == NOTEBOOK
    assert pod.spec.security_context.run_as_non_root and pod.spec.security_context.run_as_user
    (container,) = pod.spec.containers
    assert not container.env or all(e.name != "KUBECONFIG" for e in container.env)
    mounts = {m.mount_path for m in container.volume_mounts}  # no kubeconfig among them
    assert mounts == {"/home/elasticdl", "/mnt/elasticdl-nb-jobs", "/etc/ipython", ACCOUNT_MOUNT}
    # What the account may do is the user Role and nothing more.
    review = client.AuthorizationV1Api(real_admin)
    account = f"system:serviceaccount:{notebook.namespace}:{NOTEBOOK}"

    def allowed(verb: str, resource: str, group: str = "", sub: str = "", namespace=None):
        attributes = {
            "namespace": namespace or notebook.namespace,
            "verb": verb,
            "group": group,
            "resource": resource,
            "subresource": sub,
        }
        spec = {
            "user": account,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{notebook.namespace}"],
            "resourceAttributes": attributes,
        }
        return review.create_subject_access_review({"spec": spec}).status.allowed

    assert allowed("create", "jobs", "batch") and allowed("get", "secrets")
    assert allowed("list", "pods") and allowed("create", "pods", sub="portforward")
    assert not allowed("create", "pods", namespace="default")
    assert not allowed("list", "secrets") and not allowed(
        "create", "roles", "rbac.authorization.k8s.io"
    )
    assert not allowed("create", "pods", sub="exec") and not allowed("delete", "cronjobs", "batch")


def test_jupyterlab_with_the_extension_answers_through_the_port_forward_with_its_token(notebook):
    status, body = notebook.get("/api/status")
    assert status == 200, body
    assert notebook.get("/api/status", token="")[0] == 403
    assert notebook.get("/api/status", token="not-the-token")[0] == 403
    status, page = notebook.get("/lab")
    assert status == 200 and b"elasticdl-nb" in page, page[:500]
    # The server extension's job API, behind Jupyter's auth; in the cluster, as the
    # pod's service account (no kubeconfig): its own namespace's jobs, none yet.
    status, body = notebook.get(f"/elasticdl/api/jobs?namespace={notebook.namespace}")
    assert status == 200, body
    assert json.loads(body)["jobs"] == []
    assert notebook.get("/elasticdl/api/jobs", token="")[0] == 403
    status, body = notebook.get("/elasticdl/api/jobs?namespace=default")
    print(status, body)
    assert status != 200 and b"forbidden" in body.lower(), body


MINUTE = 60_000  # Playwright's timeouts are in milliseconds


@pytest.fixture(scope="module")
def browser():
    from tests.browser.chromium import chromium

    with chromium() as launched:
        yield launched


def test_from_a_browser_outside_the_quickstart_dashboard_sidebar_and_stop_work(
    notebook, browser, tmp_path, request
):
    """JupyterLab of the notebook pod in Chromium, which reaches it only through the
    port-forward. The notebook's own defaults (the manifest's IPython configuration)
    make every job a Kubernetes job in the pod's namespace on the claimed volume, with
    the pod's service account: the quickstart as it ships runs (its pods take longer to start and
    train than local processes: its 8 epochs leave the live view seconds to be seen),
    its dashboard updates while it trains, the sidebar lists the job; a second job is
    stopped from the sidebar."""
    from tests.browser.chromium import DASHBOARD, OUTPUT_SAYS, RECORD_PROGRESS, run_all_cells

    text = (REPO / "examples" / "quickstart.ipynb").read_text()
    assert text.count("--epochs 8") == 1
    notebook.put("quickstart.ipynb", text)
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    request.addfinalizer(lambda: page.screenshot(path=str(tmp_path / "last-page.png")))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{notebook.url}/lab/tree/quickstart.ipynb?token={notebook.token}")
    page.evaluate(RECORD_PROGRESS)
    run_all_cells(page)
    page.wait_for_selector(f"{DASHBOARD} .edl-progress", timeout=3 * MINUTE)
    page.wait_for_function(OUTPUT_SAYS, arg="test accuracy:", timeout=10 * MINUTE)
    shown = page.evaluate("() => window.edlProgress")
    print("progress the page showed:", shown)
    assert [v for v in shown if 0 < v < 100], f"no live update while the job ran: {shown}"
    assert "succeeded" in page.locator(DASHBOARD).first.inner_text()
    said = page.locator(".jp-OutputArea-output", has_text="test accuracy: ").first.inner_text()
    accuracy = float(said.split("test accuracy: ")[1][:6])
    assert accuracy >= 0.90

    # The sidebar lists it (the notebook's server extension, in the pod).
    page.locator(".jp-SideBar.jp-mod-left li[data-id='elasticdl-nb-sidebar']").click()
    sidebar = page.locator(".edl-sidebar")
    sidebar.wait_for(state="visible", timeout=MINUTE)
    page.wait_for_selector(".edl-job[data-state='succeeded']", timeout=MINUTE)
    assert sidebar.locator(".edl-job").count() >= 1
    # Its pods ran as the notebook's uid (1000 in the manifest), which alone may read
    # its directory on the claimed volume; the notebook read its model, metrics and
    # listing from its own mount of that claim after the job (the cells above).
    (job_dir,) = (notebook.volumes / "jobs").iterdir()
    assert job_dir.stat().st_uid == 1000 and (job_dir.stat().st_mode & 0o777) == 0o700
    assert page.locator(".jp-OutputArea-output", has_text=" loss points; first ").count() == 1

    # A long job, stopped from the sidebar.
    long_job = text.replace("--epochs 8", "--epochs 2000")
    long_job = long_job.replace(" -o job", " --name lab-long -o job")
    notebook.put("long.ipynb", long_job)
    # (a workspace of its own: the notebook alone, not beside the quickstart's)
    page.goto(f"{notebook.url}/lab/workspaces/long/tree/long.ipynb?reset&token={notebook.token}")
    run_all_cells(page)
    page.locator(".jp-SideBar.jp-mod-left li[data-id='elasticdl-nb-sidebar']").click()
    row = page.locator(".edl-job[data-job-name='lab-long']")
    page.wait_for_selector(
        ".edl-job[data-job-name='lab-long'][data-state='running']", timeout=5 * MINUTE
    )
    row.locator("button[data-action='stop']").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=MINUTE)
    with page.expect_response(lambda r: r.request.method == "DELETE", timeout=2 * MINUTE):
        dialog.locator(".jp-mod-accept").click()
    page.wait_for_selector(
        ".edl-job[data-job-name='lab-long'][data-state='stopped']:not(.edl-busy)",
        timeout=MINUTE,
    )
    assert not errors, errors
