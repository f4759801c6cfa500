"""Ring allreduce over real loopback sockets: the sum is right and bit-identical on every
member, for any group size; a wrong token is refused; and when a member is SIGKILLed
mid-collective, every survivor learns it within a second or two, not after the deadline."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from elasticdl_nb.runtime.collective import Group, PeerLost, Ring, RingListener
from elasticdl_nb.runtime.protocol.frames import greet
from tests.conftest import REPO
from tests.integration.faults import fault_rng

TOKEN = "ring-token"
SHAPES = [(3, 4), (1000,), (0,), (7,), (64, 33)]


def run_group(size: int, steps: int) -> list[list[list[np.ndarray]]]:
    """Every member's results, step by step, each member in a thread of its own."""
    listeners = {w: RingListener("127.0.0.1", TOKEN, w) for w in range(size)}
    group = Group(1, tuple((w, listeners[w].address) for w in range(size)))
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def member(worker: int) -> None:
        try:
            ring = Ring(group, worker, listeners[worker], TOKEN, timeout=10)
            rng = np.random.default_rng(worker)
            results[worker] = []
            for step in range(steps):
                arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
                results[worker].append((arrays, ring.allreduce(arrays, step, timeout=10)))
            ring.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(w,)) for w in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for listener in listeners.values():
        listener.close()
    assert not errors, errors
    return [results[w] for w in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_the_sum_is_right_and_bit_identical_on_every_member(size):
    results = run_group(size, steps=3)
    for step in range(3):
        inputs = [results[w][step][0] for w in range(size)]
        outputs = [results[w][step][1] for w in range(size)]
        for i, shape in enumerate(SHAPES):
            expected = np.sum([inputs[w][i] for w in range(size)], axis=0)
            assert outputs[0][i].shape == shape
            np.testing.assert_allclose(outputs[0][i], expected, rtol=1e-5, atol=1e-5)
            for w in range(1, size):  # replicas must stay identical: same bits everywhere
                assert outputs[w][i].tobytes() == outputs[0][i].tobytes()


@pytest.mark.parametrize(
    "token, meant", [("wrong-token", "worker-0"), (TOKEN, "worker-1")], ids=["token", "member"]
)
def test_a_connection_with_another_token_or_for_another_member_is_refused(token, meant):
    listener = RingListener("127.0.0.1", TOKEN, 0)
    host, port = listener.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        with pytest.raises(OSError):
            greet(sock, token, meant)  # closed instead of READY
    with pytest.raises(PeerLost, match="did not connect within"):
        listener.take(1, 0, timeout=0.5)
    listener.close()


@pytest.mark.slow
def test_a_member_killed_mid_collective_is_noticed_by_every_survivor_at_once():
    rng = fault_rng("ring-kill")
    size = 4
    member = [sys.executable, "-m", "tests.collective.ring_member"]
    procs = [
        subprocess.Popen(
            [*member, str(w), TOKEN],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(size)
    ]
    try:
        # Each member listens on a port of its own and says which; then all learn the group.
        members = [[w, proc.stdout.readline().split()[1]] for w, proc in enumerate(procs)]
        for proc in procs:
            proc.stdin.write(json.dumps({"version": 1, "members": members}) + "\n")
            proc.stdin.flush()
        steps_before_kill = rng.randint(3, 12)
        victim = rng.randrange(size)
        for line in procs[victim].stdout:  # let the ring run a few steps
            if line.startswith(f"step {steps_before_kill}"):
                break
        time.sleep(rng.uniform(0, 0.05))  # somewhere inside the next collective
        killed_at = time.time()
        os.kill(procs[victim].pid, signal.SIGKILL)
        print(f"killed member {victim} after step {steps_before_kill}")
        for w, proc in enumerate(procs):
            if w == victim:
                continue
            out, _ = proc.communicate(timeout=20)  # the deadline is 30 s: must be far sooner
            lost = [line for line in out.splitlines() if line.startswith("lost ")]
            assert lost, f"member {w} did not notice: {out[-300:]}"
            noticed = float(lost[0].split()[1]) - killed_at
            print(f"member {w} noticed after {noticed:.3f} s: {lost[0]}")
            assert noticed < 2.0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_news_one_member_has_reaches_every_member_within_the_same_step():
    size = 3
    listeners = {w: RingListener("127.0.0.1", TOKEN, w) for w in range(size)}
    group = Group(1, tuple((w, listeners[w].address) for w in range(size)))
    answers: dict[int, tuple] = {}

    def member(worker: int) -> None:
        ring = Ring(group, worker, listeners[worker], TOKEN, timeout=10)
        news = 3 if worker == 1 else 0  # only worker 1 heard of version 3 from the master
        values = [np.full(5, worker + 1, np.float32)]
        answers[worker] = ring.allreduce_with_news(values, step=0, timeout=10, news=news)
        ring.close()

    threads = [threading.Thread(target=member, args=(w,)) for w in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for listener in listeners.values():
        listener.close()
    for worker in range(size):
        (total,), news = answers[worker]
        assert news == 3
        assert total.tolist() == [6.0] * 5
