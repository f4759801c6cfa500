"""Whole jobs on the real node (conftest's `real_node`): a real API server with RBAC,
the real kubelet, scheduler and kube-proxy, each pod a container of the job image, real
TensorFlow training.

The notebook side acts as the cluster's unprivileged user holding only deploy/rbac.yaml's
user Role, from outside the pod network (it reaches a master by port-forward); the
master pod acts as the `elasticdl-nb-master` service account with only that file's
master Role. Faults are made by the cluster itself: a pod deleted, a worker preempted
by the scheduler for a higher-priority pod, a worker killed by its cgroup's OOM killer,
the PS pod deleted, the master's Job deleted. (The master's own death, in its container
or with its pod: test_kubernetes_master_failover.py.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import elasticdl_nb as edl
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.dashboards import rendered_dashboard
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.integration.models import (
    COMPILED_MODEL,
    DIGITS,
    accuracy,
    custom_model,
    digits_split,
)
from tests.kubernetes.job_pods import SMALL, k8s_options, pods, running_pod
from tests.kubernetes.node_cpu import cpu_pod, free_millicores, millicores

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

STEPS_PER_EPOCH = 1400 // 32 + 1


def dashboard_log(job) -> str:
    """The instance table and event log of the job's dashboard, as it shows them."""
    return rendered_dashboard(job)[1]


def test_a_notebook_cell_trains_on_kubernetes(
    ipython_shell,
    job_home,
    job_namespace,
    real_node,
    real_cluster,
    real_admin,
    tmp_path,
    monkeypatch,
    capsys,
):
    from kubernetes import client

    shell = ipython_shell
    (x, y), (xt, yt) = digits_split()
    shell.user_ns.update(x_train=x, y_train=y, x_test=xt, y_test=yt)
    for name in ("custom_model", "loss", "optimizer", "model", "feed", "eval_metrics_fn"):
        shell.user_ns.pop(name, None)
    o = k8s_options(real_cluster, job_namespace, tmp_path)
    line = (
        f"train --backend kubernetes --namespace {o['namespace']} --kubeconfig {o['kubeconfig']}"
        f" --shared-volume {o['shared_volume']} --master-resources {SMALL}"
        f" --worker-resources {SMALL} --ps-resources {SMALL} --workers 2 --epochs 4"
        " --minibatch-size 32 --data x_train y_train --validation-data x_test y_test"
        " -o kjob --wait"
    )
    shell.run_cell_magic("elasticdl", line, textwrap.dedent(COMPILED_MODEL))

    job = shell.user_ns["kjob"]
    link = job._link
    try:
        # The notebook is outside the pod network: it reached the master by port-forward
        # through the API server and the kubelet's streaming server.
        assert link._route and link._route.startswith("127.0.0.1:"), link._route
    finally:
        if link._forward is not None:  # before the API server goes, at the session's end
            link._forward.close()
    status = job.status()
    assert status["state"] == "succeeded", status
    assert status["metrics"]["accuracy"] >= 0.85
    assert accuracy(job.model(), xt, yt) >= 0.85
    events = list(job.events(follow=False))
    running = {(e.data["role"], e.data["id"]) for e in events if e.kind == "instance"
               and e.data["kind"] == "running"}  # fmt: skip
    assert {("worker", 0), ("worker", 1), ("ps", 0)} <= running  # from the pods' status
    # The dashboard's instance table holds each pod, in the state its status last said.
    # A worker pod whose end its kubelet has not reported within the master's 3 s drain
    # at the job's end (seen on a loaded machine) is deleted then, its work done.
    cells = re.findall(r"<td[^>]*>(.*?)</td>", dashboard_log(job))
    rows = {tuple(cells[i : i + 3]) for i in range(0, len(cells), 7)}
    for worker in ("0", "1"):
        assert rows & {("worker", worker, "succeeded"), ("worker", worker, "deleted")}, rows
    assert ("ps", "0", "deleted") in rows, rows  # by the master, at the end, as expected
    core = client.CoreV1Api(real_admin)

    # The master removed its workers and PS (the kubelet stops them in their grace
    # period); its own pod (its Job's, with a generated name) stays, finished, for the
    # record: a container of our image, run by containerd on the real node.
    def left():
        return pods(core, job_namespace)

    wait_for(lambda: set(left()) == set(pods(core, job_namespace, "master")), 60, "the master")
    # (`--wait` returns once the end is recorded; the master's pod exits a moment later)
    wait_for(lambda: next(iter(left().values())).status.phase != "Running", 60, "its exit")
    (master,) = left().values()
    assert master.metadata.name.startswith(f"{job.name}-master-")
    assert master.status.phase == "Succeeded"
    assert master.spec.node_name == real_node.name
    (container,) = master.status.container_statuses
    assert container.container_id.startswith("containerd://"), container
    assert container.image.endswith(real_node.job_image_ref().split("/", 1)[1]), container

    # Another notebook (its own job registry) finds the job by its labels.
    monkeypatch.setenv("ELASTICDL_NB_HOME", str(tmp_path / "another-notebook"))
    where = f"--namespace {o['namespace']} --kubeconfig {o['kubeconfig']}"
    capsys.readouterr()
    shell.run_line_magic("elasticdl", f"list {where}")
    assert job.name in capsys.readouterr().out
    found = shell.run_line_magic("elasticdl", f"attach {job.name} {where}")
    assert found.status()["state"] == "succeeded"
    assert found.metrics()["evaluation"] == job.metrics()["evaluation"]
    # So does a shell, with the CLI.
    cli = subprocess.run(
        [sys.executable, "-m", "elasticdl_nb", "status", job.name, *where.split()],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ELASTICDL_NB_HOME": str(tmp_path / "a-shell")},
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["state"] == "succeeded"


def _paced_loss(labels, predictions):
    """The digits loss with each step taking at least 50 ms, so that the job is still
    training when each fault is injected. On cue, a worker allocates past its memory
    limit: the one whose pod name is in the job directory's `oom-cue` file."""
    import os
    import socket
    import time

    import tensorflow as tf

    def pace():
        time.sleep(0.05)
        # (In the notebook's one-batch check before launch there is no job directory.)
        cue = os.path.join(os.environ.get("ELASTICDL_NB_JOB_DIR", "/nonexistent"), "oom-cue")
        if os.path.exists(cue) and open(cue).read().strip() == socket.gethostname():
            ballast = b"x" * (3 << 30)  # written, so every page is touched
            print("allocated", len(ballast), "bytes: should not be here")
        return 0.0

    pause = tf.py_function(pace, [], tf.float32)
    return DIGITS["loss"](labels, predictions) + 0.0 * tf.reshape(pause, [])


def _unsettled(core, node_name: str, namespace: str, workers: int) -> str:
    """What keeps the node's CPU from being what it will stay while the preemptor is
    placed ('' once nothing does): a pod on the node being deleted, a pod of the job not
    running, or not `workers` workers.

    Sized while a deleted worker was still terminating, the preemptor fitted once it was
    gone, without preempting anyone (CI, seed 207464299). And this kubelet (v1.20) can
    leave a deleted pod whose containers have all ended Terminating for over a minute (it
    never logs "Killing unwanted pod" for it); such a pod is dead but for its API object,
    so it is deleted for good here, as `kubectl delete --force` would."""
    from kubernetes import client

    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
    for p in on_node.items:
        if not p.metadata.deletion_timestamp:
            continue
        statuses = p.status.container_statuses or []
        where = f"{p.metadata.namespace}/{p.metadata.name}"
        if statuses and all(c.state.terminated for c in statuses):
            print(f"{where}: every container ended, still Terminating: deleted with grace 0")
            try:
                core.delete_namespaced_pod(
                    p.metadata.name, p.metadata.namespace, grace_period_seconds=0
                )
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
        return f"{where} is being deleted"
    for name, p in pods(core, namespace).items():
        if p.status.phase != "Running" or p.metadata.deletion_timestamp:
            return f"{name} is {p.status.phase}"
    running = len(pods(core, namespace, "worker"))
    return "" if running == workers else f"{running} workers, not {workers}"


def _pod_states(core, node_name: str) -> str:
    """Every pod on the node, one line each: phase, being deleted, container states (what
    a failure to settle is read from)."""
    lines = []
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
    for p in on_node.items:
        states = [
            next((k for k, v in c.state.to_dict().items() if v), "?")
            for c in p.status.container_statuses or []
        ]
        deleting = f" deleting since {p.metadata.deletion_timestamp}" if (
            p.metadata.deletion_timestamp) else ""  # fmt: skip
        lines.append(f"  {p.metadata.namespace}/{p.metadata.name}: {p.status.phase}"
                     f"{deleting}, containers {states}")  # fmt: skip
    return "\n".join(lines)


def _journal_tail(job, count: int = 25) -> str:
    """The job's state and its journal's last events (but progress), for a failure: what
    the master did while the node would not settle."""
    events = [e for e in job.events(follow=False) if e.kind not in ("progress", "loss")]
    lines = [f"job {job.status().get('state')}; the journal's last events:"]
    lines += [f"  {e.seq} {e.kind} {json.dumps(e.data)[:300]}" for e in events[-count:]]
    return "\n".join(lines)


def _preemptor(core, node_name: str) -> dict:
    """A pod of the master's priority that fits on the node only if the scheduler
    preempts one worker: it requests the node's free CPU plus half a worker's. Size it
    only once nothing leaves it `_unsettled`."""
    wanted = free_millicores(core, node_name) + millicores(SMALL.split(",")[0].split("=")[1]) // 2
    return cpu_pod("preemptor", wanted, "elasticdl-nb-high")


def test_deleted_preempted_and_oomkilled_workers_and_a_deleted_ps_lose_nothing(
    job_home, job_namespace, real_node, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("kubernetes-faults")
    epochs = 30
    (x, y), (xt, yt) = digits_split()
    options = k8s_options(real_cluster, job_namespace, tmp_path)
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        validation_data=(xt, yt),
        workers=2,
        epochs=epochs,
        minibatch_size=32,
        checkpoint_steps=25,
        record_ledger=True,
        **{**options, "worker_resources": "cpu=100m,memory=1Gi"},
        max_memory="2Gi",
    )
    total = epochs * STEPS_PER_EPOCH  # PS steps, one per minibatch
    at = sorted(rng.sample(range(20, total * 2 // 3), 4))
    print(f"faults at steps {at}")

    hit: set[str] = set()

    def victim(step: int, role: str = "worker") -> str:
        wait_for_step(job, step, timeout=300)
        name = wait_for(lambda: running_pod(core, job_namespace, role, hit), 120, f"a {role}")
        hit.add(name)
        print(f"step {step}: victim {name}")
        return name

    def ended(kind: str) -> str:
        """The pod of the worker whose instance event says `kind`, once there is one."""

        def seen():
            return next((e.data["id"] for e in job.events(follow=False)
                         if e.kind == "instance" and e.data["kind"] == kind), None)  # fmt: skip

        return f"{job.name}-worker-{wait_for(lambda: seen() is not None and seen(), 120, kind)}"

    name = victim(at[0])
    core.delete_namespaced_pod(name, job_namespace)
    print(f"deleted {name}")

    victim(at[1])  # the scheduler picks which worker; wait for both to run
    unsettled = [""]

    def settled() -> bool:
        unsettled[0] = _unsettled(core, real_node.name, job_namespace, 2)
        return not unsettled[0]

    try:
        wait_for(settled, 120, "a settled node")
    except TimeoutError:
        raise AssertionError(
            f"the node did not settle: {unsettled[0]}\n{_pod_states(core, real_node.name)}"
            f"\n{_journal_tail(job)}"
        ) from None
    hit.clear()
    core.create_namespaced_pod(job_namespace, _preemptor(core, real_node.name))
    name = ended("preempted")
    hit.add(name)
    print(f"the scheduler preempted {name}")
    core.delete_namespaced_pod("preemptor", job_namespace)  # room for its replacement

    name = victim(at[2])
    cue = tmp_path / "shared" / job.name / "oom-cue"
    cue.write_text(name)
    assert ended("oom") == name
    print(f"OOM-killed {name}")

    name = victim(at[3], "ps")
    core.delete_namespaced_pod(name, job_namespace)
    print(f"deleted {name}")

    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final
    assert final["metrics"]["accuracy"] >= 0.85
    events = list(job.events(follow=False))
    lost = [(e.data["role"], e.data["kind"]) for e in events if e.kind == "instance"
            and e.data["kind"] in ("deleted", "preempted", "oom", "killed", "failed")
            and not e.data.get("expected")]  # fmt: skip
    assert sorted(lost) == sorted(
        [("worker", "deleted"), ("worker", "preempted"), ("worker", "oom"), ("ps", "deleted")]
    ), lost
    relaunched = [(e.data["role"], e.data["reason"]) for e in events if e.kind == "relaunch"]
    assert len(relaunched) == 4, relaunched
    raised = [e.data for e in events if e.kind == "memory_raised"]
    assert [r["memory"] for r in raised] == ["1Gi -> 2Gi"]
    assert any(e.kind == "ps_restored" for e in events)
    # Every record was applied exactly once per epoch, through all four faults.
    assert ledger_problems(job.dir, 1, [len(x)], epochs) == []
    # The dashboard tells the story, from the pods' point of view.
    log = dashboard_log(job)
    for told in ("pod deleted", "Preempted by", "OOMKilled", "get 1Gi -&gt; 2Gi",
                 "relaunched worker", "relaunched ps 0", "PS 0 restored"):  # fmt: skip
        assert told in log, told


def test_scaling_through_the_api_adds_and_retires_worker_pods(
    job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    (x, y), (xt, yt) = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=1,
        epochs=6,
        minibatch_size=32,
        record_ledger=True,
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )

    def running_workers():
        return sorted(
            name for name, p in pods(core, job_namespace, "worker").items()
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        )  # fmt: skip

    wait_for_step(job, 10, timeout=300)
    job.scale(3)
    assert len(wait_for(lambda: len(running_workers()) == 3 and running_workers(), 120, "3")) == 3
    job.scale(1)
    wait_for(lambda: len(running_workers()) == 1, 120, "1 worker pod")
    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final
    assert ledger_problems(job.dir, 1, [len(x)], 6) == []


def test_deleting_the_job_deletes_every_object_and_container_of_the_job(
    job_home, job_namespace, real_node, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    batch = client.BatchV1Api(real_admin)
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=2,
        epochs=20,
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )
    wait_for_step(job, 5, timeout=300)
    # As `kubectl delete job` does: the API's default for a batch/v1 Job orphans its pods.
    batch.delete_namespaced_job(f"{job.name}-master", job_namespace,
                                propagation_policy="Background")  # fmt: skip

    label = f"elasticdl-nb/job={job.name}"

    def objects_left():
        kinds = {
            "job": batch.list_namespaced_job,
            "pod": core.list_namespaced_pod,
            "service": core.list_namespaced_service,
            "configmap": core.list_namespaced_config_map,
            "secret": core.list_namespaced_secret,
        }
        return [
            f"{kind} {o.metadata.name}"
            for kind, list_them in kinds.items()
            for o in list_them(job_namespace, label_selector=label).items
        ]

    wait_for(lambda: not objects_left(), 120, "the garbage collector", poll=0.5)
    # And the kubelet removed every container of the job's pods (sandboxes too).
    wait_for(lambda: not real_node.containers(job_namespace), 120, "the kubelet", poll=1)
    # The master got SIGTERM from the kubelet, found its Job gone, so stopped the job
    # (rather than leave it to a next master) and recorded its end on the shared volume.
    assert job.status()["state"] == "stopped"
    ended = [e.data for e in job.events(follow=False) if e.kind == "job_state"][-1]
    assert ended["reason"] == "master got SIGTERM", ended


def test_a_ps_that_cannot_be_scheduled_fails_the_job_with_the_scheduler_s_reason(
    job_home, job_namespace, real_cluster, tmp_path
):
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **DIGITS,
        data=(x, y),
        pending_timeout=5,
        **{
            **k8s_options(real_cluster, job_namespace, tmp_path),
            "ps_resources": "cpu=64,memory=1Gi",  # more than the node has
        },
    )
    with pytest.raises(edl.JobFailed, match=r"PS 0 could not start within 5 s \(unschedulable: "
                       r"0/1 nodes are available: 1 Insufficient cpu"):  # fmt: skip
        job.wait(timeout=120)
    assert "ps 0 pending: unschedulable: 0/1 nodes are available" in dashboard_log(job)


def test_a_master_image_that_cannot_be_pulled_is_reported_and_the_job_can_be_stopped(
    job_home, job_namespace, real_cluster, tmp_path
):
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model,
        **DIGITS,
        data=(x, y),
        image="registry.example/no-such-image:1",
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )
    waiting = wait_for(lambda: job.status().get("waiting"), 60, "the pull error")
    assert "ErrImagePull" in waiting or "ImagePullBackOff" in waiting
    assert job.status()["state"] == "starting"
    job.stop(timeout=1)
    # The kubelet removes the deleted master pod (no container ever ran) in a moment.
    wait_for(lambda: job.status()["state"] == "lost", 30, "the job lost")


def test_a_permission_the_master_lacks_fails_the_job_with_the_refusal_and_the_fix(
    job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    # An admin applied an older rbac.yaml whose master Role cannot create Services.
    rbac = client.RbacAuthorizationV1Api(real_admin)
    role = rbac.read_namespaced_role("elasticdl-nb-master", job_namespace)
    role.rules = [r for r in role.rules if "services" not in r.resources]
    rbac.replace_namespaced_role("elasticdl-nb-master", job_namespace, role)
    (x, y), _ = digits_split()
    job = edl.train(
        custom_model, **DIGITS, data=(x, y), **k8s_options(real_cluster, job_namespace, tmp_path)
    )
    with pytest.raises(edl.JobFailed) as failed:
        job.wait(timeout=120)
    message = str(failed.value)
    assert "the master cannot start: Cannot read Service" in message
    assert '"system:serviceaccount:' in message and "elasticdl-nb-master" in message
    assert "(HTTP 403)" in message and "Role elasticdl-nb-master" in message
    # The master that could not start exited with 1 (the kubelet restarted it in its
    # pod); the restart found the end recorded and exited with 0: the Job completed,
    # rather than restart a master that cannot start 20 times.
    batch = client.BatchV1Api(real_admin)

    def completed():
        status = batch.read_namespaced_job(f"{job.name}-master", job_namespace).status
        return any(c.type == "Complete" and c.status == "True" for c in status.conditions or [])

    wait_for(completed, 60, "the master's Job to complete")
    (master,) = pods(client.CoreV1Api(real_admin), job_namespace, "master").values()
    (container,) = master.status.container_statuses
    assert container.restart_count == 1, container
    assert json.loads(container.state.terminated.message)["state"] == "failed"


def test_a_keras_2_model_zoo_job_runs_tf_keras_in_its_pods_and_predicts(
    job_home, job_namespace, real_node, real_cluster, tmp_path
):
    """A model-zoo module only Keras 2 builds (tests/integration/test_keras2_jobs.py's):
    every pod of its job runs tf_keras (the image carries it; each pod's environment says
    so), and it predicts for a data set on the job's volume."""
    import numpy as np

    from tests.integration.test_keras2_jobs import ZOO_MODULE, keras2_job

    zoo = tmp_path / "keras2_digits.py"
    zoo.write_text(textwrap.dedent(ZOO_MODULE))
    xt = digits_split()[1][0]
    job, _, _ = keras2_job(
        zoo,
        prediction_data=xt,
        workers=2,
        epochs=4,
        **k8s_options(real_cluster, job_namespace, tmp_path),
    )
    final = job.wait(timeout=600)
    assert final["state"] == "succeeded", final
    started = next(e.data for e in job.events(follow=False) if e.kind == "job_state")
    assert started["keras"] == "2"
    assert final["metrics"]["accuracy"] >= 0.85
    model = job.model()
    assert type(model).__module__.startswith("tf_keras")
    np.testing.assert_allclose(job.predictions(), model.predict(xt, verbose=0), atol=1e-4)
