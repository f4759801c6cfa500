"""Training beside a high-priority service on the real node (ElasticDL's experiment B).

    .venv/bin/python bench/elastic_service.py [--quick]

A PS job with a worker range (`workers="1:6"`) fills the node; a Deployment of a service
that really uses the CPU it requests (bench/cpu_service.py: an HTTP server that hashes
per request, with its own load on loopback, CPU limit = request) is then scaled through
the API at fixed times, SCHEDULE, one change every STEP_S seconds. The service's
priority class ranks above the job's workers and below its master and PS (ElasticDL:
"master and PS high, workers low"), so a service pod that finds the node full preempts
workers above the job's MIN, and when the service shrinks the job's pending workers
take the room back.

Measured over the window from the first change to STEP_S after the last: the CPU
requested by the job and the service over allocatable (sampled every 0.5 s), how long
each new service pod took from the scale call to Running (the target: 5 s), how long the
job took after each scale-down to have its workers back (the target: 10 s; beside it,
when the service pods the scale-down removed were gone, so that a slow return says
whether it waited for the service or for its own pods), and after
the job's end its accuracy against the same job run alone and its PS ledger.

Requests and limits are those of bench/elastic_scheduling.py (every container's CPU
limit is a worker's request, so the pods use what the scheduler gives them).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402

harness.pin_threads()
import workloads  # noqa: E402  (after the pins: it imports TensorFlow)
from node_bench import (  # noqa: E402
    CPU_LIMIT,
    MASTER_CPU,
    PS_CPU,
    WORKER_CPU,
    CpuSampler,
    NodeBench,
    skipped,
    usage_by_role,
    usage_share,
    utilization,
)
from pod_timeline import (  # noqa: E402
    PodClock,
    service_pod_latencies,
    service_pods_gone,
    workers_back,
)

from elasticdl_nb.runtime.ps.ledger import ledger_problems  # noqa: E402
from tests.kubernetes.node import job_image_name  # noqa: E402
from tests.kubernetes.node_cpu import allocatable_millicores, free_millicores  # noqa: E402

MIN, MAX = 1, 6  # at MAX the job asks for all of the node's 1500m
SERVICE, SERVICE_CPU = "service", 200
# Between the job's master and PS (elasticdl-nb-high, 10000) and its workers (-low 1000,
# -elastic 500): a web tier outranks training workers, not a job's master.
SERVICE_CLASS, SERVICE_PRIORITY = "bench-service", 5000
# Service replicas, one change every STEP_S: at 5 the job is down to its MIN (ElasticDL:
# 0 -> 3 -> 8 -> 14 -> 8 -> 5 -> 3 CPU of 24).
SCHEDULE = (2, 4, 5, 3, 2, 1)
STEP_S = {True: 30.0, False: 50.0}  # by --quick
EPOCHS = {True: 900, False: 1500}  # the job must outlast the window (checked)
SERVICE_READY_S, WORKERS_BACK_S = 5.0, 10.0


def service_deployment(namespace: str) -> dict[str, Any]:
    code = (Path(__file__).parent / "cpu_service.py").read_text()
    cpu = f"{SERVICE_CPU}m"
    return {
        "metadata": {"name": SERVICE, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": SERVICE}},
            "template": {
                "metadata": {"labels": {"app": SERVICE}},
                "spec": {
                    "priorityClassName": SERVICE_CLASS,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "web",
                            "image": job_image_name(),
                            "command": ["python", "-c", code],
                            "resources": {
                                "requests": {"cpu": cpu, "memory": "64Mi"},
                                "limits": {"cpu": cpu, "memory": "128Mi"},
                            },
                        }
                    ],
                },
            },
        },
    }


def run_beside(w, epochs, step_s, options, admin, core, namespace, node) -> dict[str, Any]:
    from kubernetes import client

    apps = client.AppsV1Api(admin)
    apps.create_namespaced_deployment(namespace, service_deployment(namespace))
    job = w.train(workers=f"{MIN}:{MAX}", ps=1, epochs=epochs, name="beside", **options)
    clock = PodClock(core, namespace, job.name, SERVICE).start()
    sampler = CpuSampler(core, namespace, node).start()
    try:
        deadline = time.time() + w.timeout
        # The job fills the node first: MAX worker pods Running, and 10 s more to train.
        while not clock.counts or clock.counts[-1][1] < MAX:
            assert time.time() < deadline, f"the job never ran {MAX} workers: {job.status()}"
            time.sleep(1)
        time.sleep(10)
        other = allocatable_millicores(core, node) - free_millicores(core, node)
        other -= MASTER_CPU + PS_CPU + MAX * WORKER_CPU  # what else the node holds
        changes: list[tuple[float, int]] = []
        t0 = time.time()
        for i, replicas in enumerate(SCHEDULE):
            time.sleep(max(0.0, t0 + i * step_s - time.time()))
            apps.patch_namespaced_deployment_scale(
                SERVICE, namespace, {"spec": {"replicas": replicas}}
            )
            changes.append((time.time(), replicas))
            harness.log(f"service scaled to {replicas} at {changes[-1][0] - t0:.1f} s")
        time.sleep(max(0.0, t0 + len(SCHEDULE) * step_s - time.time()))
        window_end = time.time()
        outlasted = job.status()["state"] == "running"
        status = job.wait(timeout=w.timeout * 8, progress=False)
        assert status["state"] == "succeeded", status
    finally:
        clock.stop()
        sampler.stop()
        apps.delete_namespaced_deployment(SERVICE, namespace)
    allocatable = allocatable_millicores(core, node)

    def room_for(replicas: int) -> int:
        free = allocatable - other - MASTER_CPU - PS_CPU - replicas * SERVICE_CPU
        return min(MAX, free // WORKER_CPU)

    window = {"t0": t0, "makespan_s": window_end - t0, "samples": sampler.samples}
    inside = [s for s in sampler.samples if t0 <= s["t"] <= window_end]
    return {
        "name": job.name,
        "t0": t0,
        "window_s": window_end - t0,
        "outlasted_window": outlasted,
        "changes": [(t - t0, r) for t, r in changes],
        "utilization": utilization(window, allocatable),
        "service_pod_running_s": service_pod_latencies(clock, changes, SERVICE),
        "workers_back_s": workers_back(clock, changes, room_for),
        "service_pods_gone": service_pods_gone(clock, changes, SERVICE),
        "counts": [(t - t0, n, s) for t, n, s in clock.counts],
        "samples": sampler.samples,
        "usage_over_requests": usage_share({"samples": inside}),
        "usage_by_role_m": usage_by_role({"samples": inside}),
        "usage_error": sampler.usage_error,
        "other_m": other,
        "job": job,
    }


def accuracy(w, job) -> float:
    held_out = workloads.digits_data(1797)
    x, y = held_out[0][w.records :], held_out[1][w.records :]
    return float((job.model().predict(x, verbose=0).argmax(axis=1) == y).mean())


def _seconds(values) -> str:
    return ", ".join(f"{v:.1f} s" for v in values)


def build_rows(beside: dict, alone_accuracy: float) -> list[dict]:
    case = (
        f"a PS job (CNN digits, workers {MIN}:{MAX}, {MASTER_CPU + PS_CPU + MAX * WORKER_CPU}m "
        f"at MAX) beside a service of {SERVICE_CPU}m pods scaled "
        f"{' → '.join(map(str, SCHEDULE))}"
    )
    gap = abs(beside["accuracy"] - alone_accuracy)
    slowest_pod = max(beside["service_pod_running_s"], default=float("inf"))
    slowest_back = max(beside["workers_back_s"], default=float("inf"))
    service_gone = [g["gone_s"] for g in beside["service_pods_gone"]]
    return [
        harness.row(case, "CPU requested / allocatable over the window",
                    [beside["utilization"]], limit=0.90,
                    note=f"{beside['window_s']:.0f} s; ElasticDL's experiment: ≈ 0.88"),
        harness.row(case, "slowest new service pod: scale call to Running", [slowest_pod],
                    unit="s", higher_is_better=False, limit=SERVICE_READY_S,
                    note="every service pod created while the node was full"),
        harness.row(case, "slowest scale-down to the job's workers back", [slowest_back],
                    unit="s", higher_is_better=False, limit=WORKERS_BACK_S,
                    note=f"each: {_seconds(beside['workers_back_s'])}; the service's "
                         f"pods gone after {_seconds(service_gone)}"),
        harness.row(case, "|accuracy beside the service − alone|", [gap],
                    higher_is_better=False, limit=0.01,
                    note=f"beside {beside['accuracy']:.4f}, alone {alone_accuracy:.4f}"),
        harness.row(case, "PS ledger problems", [len(beside["ledger_problems"])],
                    higher_is_better=False, limit=0, note="each record once per epoch"),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter steps, fewer epochs")
    args = parser.parse_args()
    command = " ".join([".venv/bin/python bench/elastic_service.py", *sys.argv[1:]])
    title = "Elastic scheduling beside a high-priority service on the real node"
    t_start = time.perf_counter()
    if skipped("elastic_service", title, command):
        return 0
    from kubernetes import client

    w = workloads.workloads(args.quick)["cnn"].with_tasks_for(MAX)
    epochs, step_s = EPOCHS[args.quick], STEP_S[args.quick]
    with NodeBench("service") as bench, harness.job_home():
        client.SchedulingV1Api(bench.session.admin).create_priority_class(
            {"metadata": {"name": SERVICE_CLASS}, "value": SERVICE_PRIORITY,
             "description": "the benchmark's service: above training workers"}
        )  # fmt: skip
        # Alone first: the accuracy baseline, and the node's first pods read the image's
        # files here rather than in the measured run.
        _, options = bench.run_options()
        alone = w.train(workers=MAX, ps=1, epochs=epochs, name="alone", **options)
        state = alone.wait(timeout=w.timeout * 8, progress=False)["state"]
        assert state == "succeeded", state
        alone_accuracy = accuracy(w, alone)
        harness.log(f"alone: accuracy {alone_accuracy:.4f}")
        namespace, options = bench.run_options()
        beside = run_beside(
            w, epochs, step_s, options, bench.session.admin, bench.core, namespace, bench.node
        )
        beside["accuracy"] = accuracy(w, beside["job"])
        # (here: the jobs' files go with the node)
        beside["ledger_problems"] = ledger_problems(beside["job"].dir, 1, [w.records], epochs)[:5]
    rows = build_rows(beside, alone_accuracy)
    job = beside.pop("job")
    details = dict(
        bench.details,
        beside={**beside, "job": job.name},
        alone_accuracy=alone_accuracy,
        allocatable_m=bench.allocatable,
        requests={"master": MASTER_CPU, "ps": PS_CPU, "worker": WORKER_CPU,
                  "service": SERVICE_CPU},
        cpu_limit_m=CPU_LIMIT,
        workers=f"{MIN}:{MAX}",
        schedule=SCHEDULE,
        step_s=step_s,
        model=w.title,
        epochs=epochs,
        records=w.records,
    )  # fmt: skip
    if not beside["outlasted_window"]:
        details["warning"] = "the job ended inside the window: raise EPOCHS"
    harness.write_result(
        "elastic_service", title, rows, details, command=command,
        seconds=time.perf_counter() - t_start,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
