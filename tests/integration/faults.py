"""Helpers for fault tests: seeded randomness, waiting for a step, finding a pid."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

FAULT_SEED_ENV = "ELASTICDL_NB_FAULT_SEED"


def fault_rng(test_name: str) -> random.Random:
    """A seeded RNG; the seed is printed so a failing run can be replayed exactly
    (ELASTICDL_NB_FAULT_SEED=<seed> pytest ...)."""
    seed = int(os.environ.get(FAULT_SEED_ENV) or random.SystemRandom().randrange(2**31))
    print(f"{test_name}: fault seed {seed} (replay with {FAULT_SEED_ENV}={seed})")
    return random.Random(seed)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def wait_for_step(job, step: int, timeout: float = 240) -> dict:
    def reached():
        status = job.status()
        if status.get("state") not in (None, "running", "starting"):
            raise AssertionError(f"job ended before step {step}: {status}")
        return status if status.get("step", 0) >= step else None

    return wait_for(reached, timeout, f"step {step}")


def pid_of(status: dict, role: str, instance_id: int) -> int:
    for inst in status["instances"]:
        if inst["role"] == role and inst["id"] == instance_id and inst["pid"]:
            return inst["pid"]
    raise LookupError(f"no live {role} {instance_id} in {status['instances']}")


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def follow_events(job, seen: list[int]) -> threading.Thread:
    """A reader of `Job.events()` that stays on through every master restart, adding
    each event's `seq` to `seen`."""
    thread = threading.Thread(target=lambda: seen.extend(e.seq for e in job.events()), daemon=True)
    thread.start()
    return thread
