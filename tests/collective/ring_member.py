"""One member of a ring, as a process of its own (for the fault tests):

    python -m tests.collective.ring_member WORKER_ID TOKEN

It listens on a port the OS gives it and prints `listening HOST:PORT`, reads the group
(JSON: version and [worker, address] members) from a line of standard input, then
allreduces an 8 MB array step after step, printing `step N` after each, until a peer
is lost: then it prints `lost <unix time> <reason>` and exits 0.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from elasticdl_nb.runtime.collective import Group, PeerLost, Ring, RingListener


def main() -> None:
    me, token = int(sys.argv[1]), sys.argv[2]
    listener = RingListener("127.0.0.1", token, me)
    print(f"listening {listener.address}", flush=True)
    raw = json.loads(sys.stdin.readline())
    group = Group(raw["version"], tuple((int(w), a) for w, a in raw["members"]))
    ring = Ring(group, me, listener, token, timeout=30)
    values = np.full(2_000_000, float(me + 1), np.float32)
    step = 0
    while True:
        try:
            (total,) = ring.allreduce([values], step, timeout=30)
        except PeerLost as lost:
            print(f"lost {time.time():.6f} {lost}", flush=True)
            return
        assert total[0] == sum(w + 1 for w, _ in group.members), total[0]
        print(f"step {step}", flush=True)
        step += 1


if __name__ == "__main__":
    main()
