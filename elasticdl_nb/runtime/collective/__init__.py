"""Collective operations among a job's workers: the allreduce strategy's transport and
group bookkeeping.

What is here:
- `ring.py`: `Ring.allreduce` (bit-identical sums on every member, fail fast and whole)
  and `allreduce_with_news` (members agree within a step on news one of them heard);
- `handoff.py`: arrays point to point (a step's result, or a joiner's state);
- `membership.py`: the master's group versions and the one decision after a failure;
- `coordinator.py`: the same, thread-safe and blocking, for the master's RPC handlers.

How a job trains with them (the plan the worker loop follows):
- Every member runs one step after another in lockstep, all of them, always. A member
  with no minibatch contributes zero gradients and a count of 0; the sum of the counts
  divides the summed gradients, so a step averages over the minibatches really in it.
  The ids of the minibatches in a step ride the allreduce too (one slot per rank), so
  every replica knows which records it applied (the ledger), and so does whoever
  reports a dead member's minibatch as applied.
- A member learns of a newer group version from the master (a background poll) and
  passes it on as news; everyone switches after the same step. A joiner gets the model
  and optimizer state from `state_from` (handoff), then joins the next step.
- On `PeerLost` every survivor reports (version, last applied step, holds its result)
  and gets one `Recovery`: those one step behind receive that step's reduced gradients
  from `source` and apply them; then all continue in the new ring. The step that broke
  is redone with the survivors' own minibatches; the dead member's minibatch goes back
  to the queue unless the step it was in had completed.
- The deadline for a step's data is a multiple of the observed step time (with a floor),
  not a fixed number: a dead member is usually noticed at once anyway (the abort travels
  the ring); the deadline catches a member that hangs.
"""

from elasticdl_nb.runtime.collective.ring import Group, PeerLost, Ring, RingListener

__all__ = ["Group", "PeerLost", "Ring", "RingListener"]
