"""Several real nodes on one machine (extra_node.py, conftest's `four_nodes`), and what a
job survives when one of them is lost.

The nodes first: the scheduler spreads a Deployment over them, and a pod on every node
reaches the pods of the others and a Service (kube-proxy on the first node serves all:
the nodes share the host's network namespace). Then a node lost the way a VM dies (its
kubelet, runtime and containers SIGKILLed, the API server told nothing), at a random
step, with a job's workers, its PS, or its master on it: the job goes on and every record
is applied exactly once (the PS ledger). And a node cut off with the master running on it
(frozen): the master's lease fences it off, and its successor takes the job over.

    make test-node && .venv/bin/python -m pytest -v tests/kubernetes/test_several_nodes.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

import elasticdl_nb as edl
from elasticdl_nb.backends.kubernetes import master_lease
from elasticdl_nb.runtime.master.journal import read_journal_file
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.integration.models import DIGITS, custom_model, digits_split
from tests.kubernetes.job_pods import k8s_options, pods
from tests.kubernetes.placement import clear, leave_free
from tests.kubernetes.test_kubernetes_jobs import STEPS_PER_EPOCH, _paced_loss
from tests.kubernetes.test_real_node import pod_manifest, wait_phase

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

PORT = 8080


def _echo_deployment(name: str, replicas: int) -> dict:
    """`replicas` pods that answer HTTP with their own name, and are Ready when they do."""
    pod = pod_manifest(
        name,
        ["python3", "-c", _ECHO_SERVER, str(PORT)],
        container={"readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1}},
    )
    pod["spec"]["restartPolicy"] = "Always"
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod,
        },
    }


_ECHO_SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = os.environ["HOSTNAME"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Echo).serve_forever()
    """
)

# A pod that GETs every URL given and prints {url: answer or error} as JSON.
_FETCH = textwrap.dedent(
    """
    import json, sys, urllib.request
    out = {}
    for url in sys.argv[1:]:
        try:
            out[url] = urllib.request.urlopen(url, timeout=5).read().decode()
        except Exception as exc:
            out[url] = f"error: {exc}"
    print(json.dumps(out))
    """
)


def test_the_scheduler_spreads_pods_over_four_nodes_which_reach_each_other_and_services(
    four_nodes, real_admin, real_namespace
):
    from kubernetes import client

    core, apps = client.CoreV1Api(real_admin), client.AppsV1Api(real_admin)
    names = [n.name for n in four_nodes]
    ready = {
        n.metadata.name
        for n in core.list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    }
    assert ready == set(names)

    apps.create_namespaced_deployment(real_namespace, _echo_deployment("echo", len(names)))
    core.create_namespaced_service(
        real_namespace,
        {
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": PORT}]},
        },
    )

    def all_ready():
        pods = core.list_namespaced_pod(real_namespace, label_selector="app=echo").items
        done = [
            p for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
        ]  # fmt: skip
        return done if len(done) == len(names) else None

    echoes = wait_for(all_ready, 120, "an echo pod Ready per node")
    by_node = {p.spec.node_name: p for p in echoes}
    assert set(by_node) == set(names), "the scheduler put two replicas on one node"

    service_ip = core.read_namespaced_service("echo", real_namespace).spec.cluster_ip
    # kube-proxy programs the Service once its endpoints are there.
    wait_for(
        lambda: core.read_namespaced_endpoints("echo", real_namespace).subsets, 30, "endpoints"
    )
    for i, node in enumerate(names):
        # From each node: every echo pod (the others on other nodes) and the Service.
        urls = [f"http://{p.status.pod_ip}:{PORT}/" for p in echoes]
        urls.append(f"http://{service_ip}/")
        pod = pod_manifest(f"fetch-{i}", ["python3", "-c", _FETCH, *urls], nodeName=node)
        core.create_namespaced_pod(real_namespace, pod)
        done = wait_phase(core, None, real_namespace, f"fetch-{i}", {"Succeeded", "Failed"})
        answers = json.loads(core.read_namespaced_pod_log(f"fetch-{i}", real_namespace))
        expected = {f"http://{p.status.pod_ip}:{PORT}/": p.metadata.name for p in echoes}
        assert {u: a for u, a in answers.items() if u in expected} == expected, (node, answers)
        assert answers[f"http://{service_ip}/"] in expected.values(), (node, answers)
        assert done.status.phase == "Succeeded"


# --- a node lost ------------------------------------------------------------------------
#
# Each test loses an extra node of its own (the first runs the scheduler and kube-proxy
# for all); where a role runs is set by the CPU each node leaves free (placement.py), and
# the room for the lost pods' successors is made on the first node just before the loss.

MASTER, PS = "cpu=400m,memory=1Gi", "cpu=350m,memory=1Gi"  # workers: 100m (job_pods.SMALL)

# The jobs tolerate an unreachable or not-ready node for 5 s instead of the API server's
# default 300 s: a user's pod template, as a user with these needs would write it.
TOLERATIONS = """
spec:
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
"""
EPOCHS = 20


def _placed(core, namespace: str) -> dict[str, tuple[str, int, str]]:
    """The job's pods now: name -> (role, index, node)."""
    return {
        name: (
            p.metadata.labels["elasticdl-nb/role"],
            int(p.metadata.labels.get("elasticdl-nb/index", 0)),
            p.spec.node_name,
        )
        for name, p in pods(core, namespace).items()
        if not p.metadata.deletion_timestamp
    }


def _layout(core, namespace: str, real_session, first_free_m: int, victim_free_m: int):
    """The first node with `first_free_m` free, an extra node not lost yet (returned)
    with `victim_free_m`, and the other extra nodes full."""
    live = [n for n in real_session.extra if not n.lost]
    victim, others = live[0], live[1:]
    leave_free(core, namespace, real_session.node.name, first_free_m)
    leave_free(core, namespace, victim.name, victim_free_m)
    for node in others:
        leave_free(core, namespace, node.name, 0)
    return victim


def _train(real_cluster, namespace: str, tmp_path, master: str = MASTER, ps: str = PS):
    """A PS job of three workers that records its PS ledger; and its records."""
    (x, y), _ = digits_split()
    template = tmp_path / "tolerations.yaml"
    template.write_text(TOLERATIONS)
    options = k8s_options(real_cluster, namespace, tmp_path)
    job = edl.train(
        custom_model,
        **{**DIGITS, "loss": _paced_loss},
        data=(x, y),
        workers=3,
        epochs=EPOCHS,
        minibatch_size=32,
        checkpoint_steps=40,
        record_ledger=True,
        pod_template=str(template),
        **{**options, "master_resources": master, "ps_resources": ps},
    )
    return job, len(x)


def _lose_at_step(job, core, namespace: str, real_session, victim, step: int) -> tuple:
    """At `step`: where the job's pods are, checked and printed; then room made on the
    first node for what the victim ran, and the victim lost. Returns (where the pods
    were, the roles that were on the victim, when it was lost: wall clock)."""
    wait_for_step(job, step, timeout=300)
    placed = _placed(core, namespace)
    print(f"placed: {placed}")
    on_victim = sorted(r for r, _, n in placed.values() if n == victim.name)
    _make_room_on_the_first_node(core, namespace, real_session)
    victim.lose()
    print(f"lost {victim.name} with {on_victim} at step {step}")
    return placed, on_victim, time.time()


def _make_room_on_the_first_node(core, namespace: str, real_session) -> None:
    ballast = f"ballast-{real_session.node.name}"
    core.delete_namespaced_pod(ballast, namespace, grace_period_seconds=0)


def _node_lost_events(events, role: str) -> list:
    return [
        e for e in events
        if e.kind == "instance" and e.data["role"] == role
        and "NodeLost" in e.data.get("reason", "")
    ]  # fmt: skip


def _close(job, core, namespace: str, real_session, victim) -> None:
    """The job's port-forward (before the API server goes at the session's end), the
    test's ballast and what is left of the lost node (before the next test lays the
    nodes out), and a fresh controller manager: in 1.20.2 a node lost earlier can leave
    its taint manager's queue stuck, so that the next lost node is never tainted
    NoExecute (kubernetes#94183; seen here: the third loss of a module waited 10 min)."""
    if job._link._forward is not None:
        job._link._forward.close()
    clear(core, namespace)
    if victim.lost:
        undone = real_session.remove_node(victim)
        real_session.cluster.restart_controller_manager()
        assert not undone, undone


def test_a_lost_node_s_workers_are_replaced_on_the_others_and_every_record_counts_once(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-worker")
    # The master, the PS and one worker on the first node (900m), two workers on the
    # victim (200m): the room there is exactly the three workers'.
    victim = _layout(core, job_namespace, real_session, 900, 200)
    lose_at = rng.randrange(20, EPOCHS * STEPS_PER_EPOCH // 3)
    job, records = _train(real_cluster, job_namespace, tmp_path)
    try:
        placed, on_victim, lost_at = _lose_at_step(
            job, core, job_namespace, real_session, victim, lose_at
        )
        assert on_victim == ["worker", "worker"], placed
        lost_workers = {i for r, i, n in placed.values() if n == victim.name}

        def replacements_placed():
            ids = {e.data["id"] for e in job.events(follow=False) if e.kind == "relaunch"}
            now = {i: n for r, i, n in _placed(core, job_namespace).values() if i in ids}
            if len(ids) >= len(lost_workers) and len(now) == len(ids) and all(now.values()):
                return now
            return None

        ran_on = wait_for(replacements_placed, 180, "the replacements scheduled", poll=0.5)
        final = job.wait(timeout=600)
    finally:
        _close(job, core, job_namespace, real_session, victim)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    lost = _node_lost_events(events, "worker")
    assert {e.data["id"] for e in lost} == lost_workers
    assert {e.data["kind"] for e in lost} == {"preempted"}  # not the workers' fault
    relaunched = {e.data["replaces"]: e.data["id"] for e in events if e.kind == "relaunch"}
    assert set(relaunched) == lost_workers
    print(f"lost workers ended {lost[0].time - lost_at:.1f} s after the node")
    # Their replacements ran on the nodes left.
    assert victim.name not in set(ran_on.values()), ran_on
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []


def test_a_lost_node_s_ps_is_relaunched_elsewhere_from_its_checkpoint(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-ps")
    # The master (400m) and the workers (3 x 100m) on the first node, the PS (350m) alone
    # on the victim (the scheduler places it before the workers: it has the higher
    # priority).
    victim = _layout(core, job_namespace, real_session, 700, 350)
    lose_at = rng.randrange(60, EPOCHS * STEPS_PER_EPOCH // 3)  # after a PS checkpoint
    job, records = _train(real_cluster, job_namespace, tmp_path)
    try:
        placed, on_victim, lost_at = _lose_at_step(
            job, core, job_namespace, real_session, victim, lose_at
        )
        assert on_victim == ["ps"], placed
        final = job.wait(timeout=600)
    finally:
        _close(job, core, job_namespace, real_session, victim)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    (lost,) = _node_lost_events(events, "ps")
    assert lost.data["kind"] == "preempted"
    (relaunch,) = [e for e in events if e.kind == "relaunch"]
    assert (relaunch.data["role"], relaunch.data["id"]) == ("ps", 0)
    # The new PS served again from its newest checkpoint, not from nothing.
    back = [e for e in events if e.kind == "instance" and e.seq > relaunch.seq
            and e.data["role"] == "ps" and "restored_version" in e.data]  # fmt: skip
    assert back and back[0].data["restored_version"] > 0, back
    print(
        f"PS lost {lost.time - lost_at:.1f} s after its node, serving again "
        f"{back[0].time - lost_at:.1f} s after it (version {back[0].data['restored_version']})"
    )
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a container's processes, from the host)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_master_frozen_on_a_cut_off_node_is_fenced_by_its_lease_and_adds_nothing_after(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    """The master's node cut off while it runs on: its kubelet and the master's processes
    frozen (SIGSTOP) at a random step, and its pod force-deleted (what an admin's
    `kubectl delete --force`, or a node controller that gave up on the node, leaves: the
    Job makes a new master pod while the old master still runs). The new master takes
    the job's lease once it expired and takes the job over; thawed, the old master finds
    its lease lost and exits without another journal event; the job succeeds, every
    record applied once."""
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("fenced-master")
    # The master alone on the victim, as in the next test (this one does not lose it).
    victim = _layout(core, job_namespace, real_session, 650, 700)
    freeze_at = rng.randrange(20, EPOCHS * STEPS_PER_EPOCH // 3)
    job, records = _train(real_cluster, job_namespace, tmp_path, master="cpu=700m,memory=1Gi")
    # The journal read from the shared volume: the client's port-forward to the master
    # would go through the frozen kubelet.
    journal = job.dir / "events.jsonl"
    kubelet = victim.procs["kubelet"].pid
    frozen: list[int] = []
    try:
        wait_for_step(job, freeze_at, timeout=300)
        placed = _placed(core, job_namespace)
        assert [r for r, _, n in placed.values() if n == victim.name] == ["master"], placed
        (old_pod,) = [name for name, (r, _, _) in placed.items() if r == "master"]
        status = core.read_namespaced_pod(old_pod, job_namespace).status
        master_pid = victim.container_pid(status.container_statuses[0].container_id)
        frozen = [kubelet, *_process_tree(master_pid)]
        _signal_all(frozen, signal.SIGSTOP)
        frozen_at = time.time()
        core.patch_node(victim.name, {"spec": {"unschedulable": True}})
        _make_room_on_the_first_node(core, job_namespace, real_session)
        core.delete_namespaced_pod(old_pod, job_namespace, grace_period_seconds=0)
        print(f"froze {victim.name}'s kubelet and master {master_pid} at step {freeze_at}")

        def taken_over():
            events = read_journal_file(journal)
            return next((e for e in events if e.kind == "master_restarted"), None)

        restart = wait_for(taken_over, 180, "a new master to take the job over", poll=0.5)
        _signal_all(frozen[1:], signal.SIGCONT)  # the old master thaws, its kubelet not yet
        thawed_at = time.time()
        wait_for(lambda: not Path(f"/proc/{master_pid}").exists(), 30, "the old master to go")
        gone_at = time.time()
        _signal_all([kubelet], signal.SIGCONT)
        final = job.wait(timeout=600)
    finally:
        _signal_all(frozen, signal.SIGCONT)
        core.patch_node(victim.name, {"spec": {"unschedulable": False}})
        _close(job, core, job_namespace, real_session, victim)
        real_session.cluster.restart_controller_manager()  # (the node may have gone NotReady)
    assert final["state"] == "succeeded", final.get("error")

    # The successor waited for the lease to expire, not for the old master to go.
    assert restart.time - frozen_at >= master_lease.LEASE_SECONDS, restart.time - frozen_at
    assert restart.data["adopted"] == 4  # the PS and three workers went on in their pods
    log = (job.dir / "logs" / "master.log").read_text()
    assert "this master stops acting and exits" in log
    events = list(read_journal_file(journal))
    assert [e.seq for e in events] == list(range(len(events)))  # one writer at a time
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []
    print(
        f"a new master took over {restart.time - frozen_at:.1f} s after the freeze; the old "
        f"one, thawed, exited within {gone_at - thawed_at:.1f} s"
    )


def test_a_lost_node_s_master_is_followed_by_a_new_pod_that_takes_the_job_over(
    four_nodes, real_session, job_home, job_namespace, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("node-loss-master")
    # The master (700m here) alone on the victim; the PS and the workers (650m) on the
    # first node, where the master does not fit.
    victim = _layout(core, job_namespace, real_session, 650, 700)
    lose_at = rng.randrange(20, EPOCHS * STEPS_PER_EPOCH // 3)
    job, records = _train(real_cluster, job_namespace, tmp_path, master="cpu=700m,memory=1Gi")
    try:
        placed, on_victim, lost_at = _lose_at_step(
            job, core, job_namespace, real_session, victim, lose_at
        )
        assert on_victim == ["master"], placed
        final = job.wait(timeout=600)
    finally:
        _close(job, core, job_namespace, real_session, victim)
    assert final["state"] == "succeeded", final.get("error")

    events = list(job.events(follow=False))
    (restart,) = [e for e in events if e.kind == "master_restarted"]
    assert restart.data["adopted"] == 4  # the PS and three workers went on in their pods
    assert not [e for e in events if e.kind == "relaunch"]
    print(
        f"a new master took over {restart.time - lost_at:.1f} s after the node was lost "
        f"(rebuilt in {restart.data['rebuild_s'] * 1000:.0f} ms)"
    )
    assert ledger_problems(job.dir, 1, [records], EPOCHS) == []
