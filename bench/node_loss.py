"""A lost Kubernetes node, timed: what Kubernetes takes and what we take.

    .venv/bin/python bench/node_loss.py

Needs root and what `make test-cluster` and `make test-node` build (else a result that
says why it was skipped). Four real nodes on this machine (the real node and three more,
tests/kubernetes/extra_node.py); for each role in turn, a paced PS job of three workers
(tests/kubernetes/node_loss.py, the node-loss tests' job: its pods tolerate a lost node
for 5 s) is laid out so that the role, and only it, runs on one extra node (two workers;
the PS; the master), and that node is lost at step LOSE_AT (after the PS's second
checkpoint) the way a VM dies: its kubelet, runtime and containers SIGKILLed together.

Split, by this process's clock (the nodes share it), polled every 0.25 s from the API
server as the admin: Kubernetes' part, from the loss to the Node seen not Ready (the node
controller's grace, 20 s on the test cluster, `tests/kubernetes/cluster.py`) and on to
the role's pods seen deleted (the taint manager, after the pods' 5 s toleration); then
ours, from the pods deleted (as polled, or as the master's NodeLost event says, which
comes first) to training resumed, by the journal: for workers the first
loss a replacement reports, for the PS the first loss after the relaunched PS restored
its checkpoint, for the master the first loss after the new master took over (it waits
for the lost master's lease to expire: `master_lease.LEASE_SECONDS` from the moment it
first sees it). The rows carry no baseline: Kubernetes' part is the other half of the
same loss, not a rival. Every job must end `succeeded` with its PS ledger exact.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402

harness.pin_threads()
from node_bench import NodeBench, skipped  # noqa: E402
from pod_timeline import Poller  # noqa: E402

from elasticdl_nb.runtime.master.journal import read_journal_file  # noqa: E402
from elasticdl_nb.runtime.ps.ledger import ledger_problems  # noqa: E402
from tests.kubernetes import node_loss  # noqa: E402

LOSE_AT = 90  # a step after the PS's second checkpoint (checkpoint_steps=40)
ROLES = ("worker", "ps", "master")


class NodeWatch(Poller):
    """When the victim's Node was first seen not Ready, and each of the job's pods on it
    first seen with a deletion timestamp (this process's clock)."""

    def __init__(self, core, namespace: str, node: str):
        super().__init__("node-watch")
        self.core, self.namespace, self.node = core, namespace, node
        self.not_ready: float | None = None
        self.deleted: dict[str, float] = {}

    def poll(self) -> None:
        now = time.time()
        try:
            if self.not_ready is None:
                conditions = self.core.read_node(self.node).status.conditions or []
                ready = [c.status for c in conditions if c.type == "Ready"]
                if ready and ready[0] != "True":
                    self.not_ready = now
            for p in self.core.list_namespaced_pod(self.namespace).items:
                labels = p.metadata.labels or {}  # (the ballast pods have none)
                on_victim = p.spec.node_name == self.node and labels.get("elasticdl-nb/role")
                if on_victim and p.metadata.deletion_timestamp:
                    self.deleted.setdefault(p.metadata.name, now)
        except Exception:  # (the API server busy: the next poll sees it)
            pass


def _resumed(events: list, role: str) -> tuple[float, str]:
    """When training resumed after the loss of `role`'s node (journal time), and how."""
    losses = [e for e in events if e.kind == "loss"]
    if role == "worker":
        new = {e.data["id"] for e in events if e.kind == "relaunch"}
        first = next(e for e in losses if e.data.get("worker") in new)
        return first.time, f"replacement worker {first.data['worker']}'s first loss"
    if role == "ps":
        back = [
            e for e in events
            if e.kind == "instance" and e.data["role"] == "ps" and "restored_version" in e.data
        ][-1]  # fmt: skip
        first = next(e for e in losses if e.seq > back.seq)
        version = back.data["restored_version"]
        return first.time, f"first loss after the PS restored version {version}"
    (restart,) = [e for e in events if e.kind == "master_restarted"]
    first = next(e for e in losses if e.seq > restart.seq)
    return first.time, f"first loss after the new master took over ({restart.time:.1f})"


def lose_one(bench: NodeBench, role: str, workdir: Path) -> dict[str, Any]:
    """Lay the nodes out for `role`, train, lose its node at LOSE_AT: the timeline."""
    session, core = bench.session, bench.core
    namespace = session.job_namespace()
    victim = node_loss.layout(core, namespace, session, role)
    job, records = node_loss.train(session.cluster, namespace, workdir, role)
    watch = NodeWatch(core, namespace, victim.name)
    try:
        _, on_victim, lost_at = node_loss.lose_at_step(
            job, core, namespace, session, victim, LOSE_AT
        )
        watch.start()
        final = job.wait(timeout=900, progress=False)
    finally:
        watch.stop()
        node_loss.close(job, core, namespace, session, victim)
    events = list(read_journal_file(job.dir / "events.jsonl"))
    resumed, how = _resumed(events, role)
    # A lost worker's or PS's pod, deleted by the taint manager, is seen by the master at
    # once (its NodeLost event) and a PS's removed for its relaunch under the same name
    # within milliseconds: a poll may miss it, the journal does not.
    seen = list(watch.deleted.values()) + [
        e.time for e in events
        if e.kind == "instance" and "NodeLost" in e.data.get("reason", "")
    ]  # fmt: skip
    deleted = min(seen) if seen else None
    timeline = {
        "role": role,
        "on_victim": on_victim,
        "state": final["state"],
        "ledger_problems": ledger_problems(job.dir, 1, [records], node_loss.EPOCHS)[:5],
        "not_ready_s": watch.not_ready - lost_at if watch.not_ready else None,
        "deleted_s": deleted - lost_at if deleted else None,
        "resumed_s": resumed - lost_at,
        "resumed_by": how,
    }
    harness.log(f"{role}: {timeline}")
    return timeline


def build_rows(timelines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in timelines:
        case = f"a node lost with the {'two workers' if t['role'] == 'worker' else t['role']}"
        ours = t["resumed_s"] - t["deleted_s"]
        rows += [
            harness.row(case, "node lost → training resumed", [t["resumed_s"]], unit="s",
                        higher_is_better=False, note=t["resumed_by"]),
            harness.row(case, "Kubernetes: lost → NotReady → pods deleted", [t["deleted_s"]],
                        unit="s", higher_is_better=False,
                        note=f"NotReady after {t['not_ready_s']:.1f} s"),
            harness.row(case, "ours: pods deleted → training resumed", [ours], unit="s",
                        higher_is_better=False),
            harness.row(case, "PS ledger problems", [len(t["ledger_problems"])],
                        higher_is_better=False, limit=0, note="each record once per epoch"),
        ]  # fmt: skip
    return rows


def main() -> int:
    command = ".venv/bin/python bench/node_loss.py"
    title = "A lost Kubernetes node: Kubernetes' part and ours"
    t_start = time.perf_counter()
    if skipped("node_loss", title, command):
        return 0
    timelines = []
    with NodeBench("node-loss", reserved_cpu_m=0) as bench, harness.job_home():
        bench.session.add_nodes(3)
        bench.details["add_nodes_s"] = bench.session.seconds.get("add_nodes")
        for role in ROLES:
            with tempfile.TemporaryDirectory(prefix=f"edl-node-loss-{role}-") as workdir:
                timelines.append(lose_one(bench, role, Path(workdir)))
    for t in timelines:
        assert t["state"] == "succeeded", t
    harness.write_result(
        "node_loss", title, build_rows(timelines),
        dict(bench.details, timelines=timelines, lose_at=LOSE_AT, epochs=node_loss.EPOCHS),
        command=command, seconds=time.perf_counter() - t_start,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
