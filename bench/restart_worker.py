"""One worker of the restart-style baseline of bench/allreduce_recovery.py.

    python bench/restart_worker.py --rank R --ports P0,P1,P2 --dir D --incarnation I

What TorchElastic (torchrun) and Horovod Elastic do with a training script: every worker
of an incarnation loads the last checkpoint if there is one, joins the ring of that
incarnation, and trains; rank 0 checkpoints every CHECKPOINT_STEPS steps. When any worker
dies, the agent (the benchmark) stops all of them and starts a new incarnation.

The training itself is ours, so that only the recovery differs: the same replica
(elasticdl_nb/runtime/worker/replica.py: the digits MLP of bench/workloads.py, Adam),
the same ring allreduce over the same transport, the same minibatches of 64 records.
The rendezvous is free here (fixed ports handed out by the agent, no etcd or c10d store),
which only flatters the baseline. Each completed step appends "step unix_time" to
D/stamps-I-R.txt.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import harness

harness.pin_threads()
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import workloads  # noqa: E402

from elasticdl_nb.model.contract import ModelContract  # noqa: E402
from elasticdl_nb.runtime.collective.ring import Group, Ring, RingListener  # noqa: E402
from elasticdl_nb.runtime.worker.replica import Replica  # noqa: E402

# workloads.py gives its own (single-process) baseline the whole machine at import; this
# process is one of three on 2 cores, like each process of our jobs: one thread each.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

CHECKPOINT_STEPS = 50
BATCH = 64
TOKEN = "restart-style-baseline"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ports", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    world = len(ports)
    x, y = workloads.digits_data(1408)
    replica = Replica(ModelContract(workloads.digits_mlp, workloads.digits_loss, workloads.adam))
    replica.build(x[:BATCH])
    step = 0
    checkpoint = args.dir / "checkpoint.npz"
    if checkpoint.exists():
        saved = np.load(checkpoint)
        step = int(saved["step"])
        replica.set_state([saved[f"a{i}"] for i in range(len(saved.files) - 1)])
    listener = RingListener("127.0.0.1", TOKEN, args.rank, port=ports[args.rank])
    group = Group(args.incarnation, tuple((r, f"127.0.0.1:{p}") for r, p in enumerate(ports)))
    ring = Ring(group, args.rank, listener, TOKEN, timeout=120)
    batches = len(x) // BATCH
    with open(args.dir / f"stamps-{args.incarnation}-{args.rank}.txt", "a", buffering=1) as out:
        while True:
            step += 1
            i = ((step - 1) * world + args.rank) % batches
            minibatch = slice(i * BATCH, (i + 1) * BATCH)
            _, grads = replica.gradients(x[minibatch], y[minibatch])
            (summed,) = ring.allreduce([grads], step, timeout=60)
            replica.apply(summed / (world * BATCH))
            out.write(f"{step} {time.time():.6f}\n")
            if args.rank == 0 and step % CHECKPOINT_STEPS == 0:
                state = {f"a{i}": a for i, a in enumerate(replica.state())}
                partial = args.dir / "checkpoint-partial.npz"
                np.savez(partial, step=step, **state)
                os.replace(partial, checkpoint)


if __name__ == "__main__":
    main()
