"""Two users, two namespaces, one cluster (issue 36): each has a notebook pod of
deploy/notebook.yaml under a service account of their own, and a uid of their own (as an
admin gives each user), and both users' job claims reach one storage export (the case
where file modes are all that keeps their files apart).

B starts a job from B's notebook; A, from A's notebook, tries everything on it: the
magics (list, attach, scale, stop, logs), the SDK, B's Secret (the job token and TLS
keys) through the API, B's job files on the shared storage from a pod of A's own, and
A's server extension's job API. Every attempt is refused with a message that says why,
at once, and B's job trains on to B's own stop.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.kubernetes.notebook_pod import notebook_pod, quickstart_cells, run_in_kernel

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

# Each user's own, as the admin sets them in notebook.yaml (above the machine's own users:
# test_two_unix_users.py runs local jobs as 1001-ish users and checks what they own).
UID_A, UID_B = 20001, 20002
B_JOB = "b-job"


@pytest.fixture(scope="module")
def users(real_cluster, real_admin, real_node, tmp_path_factory):
    """A's and B's notebooks (A first), each in a fresh namespace set up for jobs."""
    from tests.kubernetes.conftest import _namespace
    from tests.kubernetes.node_session import set_up_for_jobs

    storage = tmp_path_factory.mktemp("shared-storage")  # both claims of jobs reach ./jobs
    made = [_namespace(real_cluster, real_admin) for _ in range(2)]
    a_ns, b_ns = (next(m) for m in made)
    for namespace in (a_ns, b_ns):
        set_up_for_jobs(real_cluster, real_admin, namespace)
    with (
        notebook_pod(real_node, real_admin, a_ns, storage, run_as=(UID_A, UID_A)) as a,
        notebook_pod(real_node, real_admin, b_ns, storage, run_as=(UID_B, UID_B)) as b,
    ):
        yield a, b, storage
    for m in made:
        next(m, None)


@pytest.fixture(scope="module")
def b_job(users):
    """B's job, training (long enough to outlast every attempt), started from B's kernel."""
    _, b, _ = users
    outputs = run_in_kernel(
        b,
        [
            quickstart_cells()[0],  # the data
            f"%%elasticdl train --workers 1 --ps 1 --epochs 400 --minibatch-size 32 "
            f"--data x_train y_train --name {B_JOB} -o job\n" + "import keras\n"
            "model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])\n"
            "model.compile(optimizer='sgd', loss=keras.losses.SparseCategoricalCrossentropy("
            "from_logits=True))\n",
            "import time\n"
            "deadline = time.monotonic() + 300\n"
            "while job.status().get('step', 0) < 5 and time.monotonic() < deadline:\n"
            "    time.sleep(1)\n"
            "print('B step', job.status().get('step', 0), job.status()['state'])\n",
        ],
        timeout=600,
    )
    print("\n".join(outputs))
    assert "Traceback" not in "".join(outputs), outputs
    step = int(outputs[-1].split("B step ")[1].split()[0])
    assert step >= 5, outputs
    return step


ATTEMPTS = """
import json, os
import elasticdl_nb as edl
from kubernetes import client, config

B = {b_ns!r}
outcomes = {{}}

def attempt(what, action):
    try:
        outcomes[what] = {{"returned": repr(action())[:300]}}
    except Exception as exc:
        outcomes[what] = {{"raised": type(exc).__name__, "message": str(exc)[:600]}}

attempt("jobs", lambda: [j["name"] for j in edl.jobs()])
attempt("jobs in B", lambda: edl.jobs(namespace=B))
attempt("attach in B", lambda: edl.attach({job!r}, namespace=B))
attempt("attach", lambda: edl.attach({job!r}))
config.load_incluster_config()
core, batch = client.CoreV1Api(), client.BatchV1Api()
attempt("read B's Secret", lambda: core.read_namespaced_secret({job!r} + "-token", B))
attempt("list B's Secrets", lambda: core.list_namespaced_secret(B))
attempt("list B's pods", lambda: core.list_namespaced_pod(B))
attempt("delete B's Job", lambda: batch.delete_namespaced_job({job!r} + "-master", B))
attempt("B's PS log", lambda: core.read_namespaced_pod_log({job!r} + "-ps-0", B))
print(json.dumps(outcomes))
"""


def test_a_user_sees_and_reaches_nothing_of_another_users_job(users, b_job):
    a, b, _ = users
    magics = [
        "%elasticdl list",
        f"%elasticdl list --namespace {b.namespace}",
        f"%elasticdl attach {B_JOB} --namespace {b.namespace}",
        f"%elasticdl status {B_JOB} --namespace {b.namespace}",
        f"%elasticdl scale {B_JOB} --workers 3 --namespace {b.namespace}",
        f"%elasticdl stop {B_JOB} --force --namespace {b.namespace}",
        f"%elasticdl logs {B_JOB} --namespace {b.namespace}",
    ]
    t0 = time.monotonic()
    outputs = run_in_kernel(a, [*magics, ATTEMPTS.format(b_ns=b.namespace, job=B_JOB)], timeout=300)
    print(f"A's attempts took {time.monotonic() - t0:.1f} s")
    for magic, output in zip(magics, outputs, strict=False):
        print(f"--- {magic}\n{output}")
        assert "Traceback" not in output, (magic, output)
    listed, *refused = outputs[: len(magics)]
    assert B_JOB not in listed and "no jobs" in listed
    for magic, output in zip(magics[1:], refused, strict=True):
        assert "forbidden" in output.lower() and b.namespace in output, (magic, output)
    outcomes = json.loads(outputs[-1].splitlines()[-1])
    print(json.dumps(outcomes, indent=1))
    assert outcomes["jobs"] == {"returned": "[]"}
    assert outcomes["attach"]["raised"] == "JobNotFound"
    for what in ("jobs in B", "attach in B"):
        assert outcomes[what]["raised"] == "KubernetesForbidden", (what, outcomes[what])
        assert "forbidden" in outcomes[what]["message"].lower(), (what, outcomes[what])
    for what in ("read B's Secret", "list B's Secrets", "list B's pods", "delete B's Job",
                 "B's PS log"):  # fmt: skip
        refused = outcomes[what]["raised"] in ("ApiException", "ForbiddenException")
        assert refused, (what, outcomes[what])
        assert "(403)" in outcomes[what]["message"], (what, outcomes[what])


def test_a_users_server_extension_lists_and_reaches_none_of_another_users_jobs(users, b_job):
    a, b, _ = users
    status, body = a.get("/elasticdl/api/jobs")
    assert status == 200 and B_JOB not in body.decode(), body
    for path in (
        f"/elasticdl/api/jobs?namespace={b.namespace}",
        f"/elasticdl/api/jobs/{B_JOB}?namespace={b.namespace}",
        f"/elasticdl/api/jobs/{B_JOB}/logs?namespace={b.namespace}",
    ):
        status, body = a.get(path)
        assert status == 403 and b"forbidden" in body.lower(), (path, status, body)
        assert b"Traceback" not in body


def test_a_pod_of_one_user_cannot_read_another_users_job_files_on_shared_storage(
    users, b_job, real_admin
):
    """A may create pods in A's namespace (the user Role), mounting A's claim of jobs,
    which reaches the same storage as B's: running as A's uid, B's job directory is
    closed to it (B's job runs as B's uid and keeps its directory to itself)."""
    from kubernetes import client

    from tests.kubernetes.node import job_image_name
    from tests.kubernetes.test_real_node import wait_phase

    a, b, storage = users
    b_dir = storage / "jobs" / B_JOB
    assert b_dir.stat().st_uid == UID_B and (b_dir.stat().st_mode & 0o777) == 0o700
    assert (b_dir / "events.jsonl").exists()
    core = client.CoreV1Api(real_admin)
    script = (
        f"ls /jobs; for f in {B_JOB} {B_JOB}/events.jsonl {B_JOB}/spec.json; do "
        f"cat /jobs/$f >/dev/null 2>&1 && echo read $f || echo denied $f; done"
    )
    core.create_namespaced_pod(
        a.namespace,
        {
            "metadata": {"name": "snoop"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsUser": UID_A, "runAsGroup": UID_A},
                "containers": [
                    {
                        "name": "main",
                        "image": job_image_name(),
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "jobs", "mountPath": "/jobs"}],
                    }
                ],
                "volumes": [
                    {"name": "jobs", "persistentVolumeClaim": {"claimName": "elasticdl-nb-jobs"}}
                ],
            },
        },
    )
    wait_phase(core, None, a.namespace, "snoop", ("Succeeded", "Failed"), 90)
    log = core.read_namespaced_pod_log("snoop", a.namespace)
    print(log)
    assert B_JOB in log.splitlines()[0].split(), log  # it sees the name, nothing inside
    assert "read" not in log.split() and log.count("denied") == 3, log


def test_the_other_users_job_trained_on_and_its_user_stops_it(users, b_job):
    _, b, _ = users
    outputs = run_in_kernel(
        b,
        [
            "import elasticdl_nb as edl\n"
            f"job = edl.attach({B_JOB!r})\n"
            "print('B step', job.status()['step'], job.status()['state'])\n"
            "print('B stopped', job.stop()['state'])\n"
        ],
        timeout=120,
    )
    print(outputs[0])
    step = int(outputs[0].split("B step ")[1].split()[0])
    assert step > b_job, outputs
    assert "running" in outputs[0] and "B stopped stopped" in outputs[0], outputs
