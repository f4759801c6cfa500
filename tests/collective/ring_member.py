"""One member of a ring, as a process of its own (for the fault tests):

    python -m tests.collective.ring_member GROUP_JSON WORKER_ID TOKEN

It allreduces an 8 MB array step after step, printing `step N` after each, until a peer
is lost: then it prints `lost <unix time> <reason>` and exits 0.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from elasticdl_nb.runtime.collective import Group, PeerLost, Ring, RingListener


def main() -> None:
    raw, me, token = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    group = Group(raw["version"], tuple((int(w), a) for w, a in raw["members"]))
    host, port = dict(group.members)[me].rsplit(":", 1)
    listener = RingListener(host, token, int(port))
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
