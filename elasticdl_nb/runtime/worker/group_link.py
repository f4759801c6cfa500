"""An allreduce member's link to its group: the group version it is in, the ring to the
other members, the newest version the master has, and the transfers that bring a member
to the group's state.

The member (`lockstep.Lockstep`) decides when to move; the link talks to the master and
to the other members:
- entering (`join`): the master says whether this member starts the group (from nothing
  or from the replicas' checkpoint) or receives the model from a member already in it
  (`receive_state`);
- switching (`fetch`, `connect`): after a step, to the newer version a member heard of
  (`latest`, polled); the first member of the new group that was in the old one sends
  the replica to every newcomer (`send_state`);
- recovery (`report_lost`, `send_result`, `receive_result`): after a `PeerLost`, the
  master's plan for every survivor (runtime/collective/membership.py); the member whose
  step completed sends that step's sums to those one step behind.

A change of group (formed, joined, left, failure) is kept (`changed`) until the first
step of the new group completes (`settled`), for the time it took.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from elasticdl_nb.runtime.collective.handoff import receive_arrays, receive_state, send_arrays
from elasticdl_nb.runtime.collective.ring import Group, PeerLost, Ring, RingListener
from elasticdl_nb.runtime.process_env import ProcessEnv
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc

log = logging.getLogger("elasticdl_nb.worker")

RING_TIMEOUT = 5.0  # to connect a new ring (everyone is at the same step boundary)
JOIN_STATE_TIMEOUT = 300.0  # a joiner waits this long for the model


class GroupLink:
    def __init__(self, env: ProcessEnv, me: int, master: rpc.MasterStub):
        self.env, self.me, self.master = env, me, master
        self.listener = RingListener(env.bind_host or "127.0.0.1", env.token, me, tls=env.tls)
        self.group: Group | None = None
        self.ring: Ring | None = None
        self.latest = 0  # the newest group version the master has
        self._change: tuple[float, str] | None = None  # (since, cause) until a step settles
        self._closed = threading.Event()

    @property
    def leads(self) -> bool:
        """Whether this member is its group's first: it reports for the group (the loss,
        a change settled) and checkpoints the replica."""
        return self.group.members[0][0] == self.me

    # ------------------------------------------------------------------ membership

    def join(self) -> pb.GroupInfo:
        """Ask the master to enter the group; its answer says where the model comes from
        (`state_from`: this member, another, or -1; `restore`: a checkpoint to start from)."""
        return self.master.JoinGroup(
            pb.JoinRequest(worker_id=self.me, address=self.listener.address), timeout=600
        )

    def fetch(self, version: int, timeout: float | None = None) -> Group:
        """Group `version` as the master has it."""
        return group_of(self.master.GetGroup(pb.GroupRequest(version=version), timeout=timeout))

    def connect(self, group: Group) -> None:
        """Enter `group`: a new ring to its members (the old one closed)."""
        if self.ring is not None:
            self.ring.close()
        self.ring = None
        self.group = group
        self.ring = Ring(
            group, self.me, self.listener, self.env.token, RING_TIMEOUT, tls=self.env.tls
        )

    def poll_versions(self) -> None:
        """Keep `latest` current, on a thread of its own, until `close`."""
        threading.Thread(target=self._poll, daemon=True, name="group-poll").start()

    def _poll(self) -> None:
        while not self._closed.wait(0.1):
            try:
                self.latest = self.master.GetGroup(pb.GroupRequest(), timeout=5).version
            except Exception:  # noqa: BLE001 - the step loop notices a master that is gone
                pass

    def changed(self, cause: str, since: float | None = None) -> None:
        """The group changed (`cause`, a `GroupChange`) at `since` (now by default)."""
        self._change = (time.monotonic() if since is None else since, cause)

    def settled(self) -> tuple[float, str] | None:
        """After a step: the change it settled, (since, cause), if there was one."""
        change, self._change = self._change, None
        return change

    def close_ring(self) -> None:
        if self.ring:
            self.ring.close()

    def close(self) -> None:
        self._closed.set()
        self.close_ring()

    # ------------------------------------------------------------------ the model

    def send_state(
        self, group: Group, old_members: set[int], state: Callable[[], list[np.ndarray]]
    ) -> None:
        """If this member is the first of `group` that was in `old_members`, send the
        replica (`state()`: [step, the minibatches it holds, its arrays...]) to every
        member of `group` that was not."""
        carriers = [w for w, _ in group.members if w in old_members]
        if not carriers or carriers[0] != self.me:
            return
        arrays = state()
        for worker, address in group.members:
            if worker not in old_members:
                send_arrays(
                    address, self.env.token, group.version, self.me, worker, arrays,
                    RING_TIMEOUT, purpose="state", tls=self.env.tls,
                )  # fmt: skip
                log.info("sent the model (step %d) to worker %d", int(arrays[0]), worker)

    def receive_state(self) -> tuple[int, list[np.ndarray]]:
        """The replica a member of the group sends this joiner: (the group version it
        was sent for, the arrays `send_state` sent)."""
        return receive_state(self.listener, JOIN_STATE_TIMEOUT)

    # ------------------------------------------------------------------ recovery

    def report_lost(
        self, lost: PeerLost, completed_step: int, holds_result: bool, unreported: list
    ) -> pb.RecoveryPlan:
        """Tell the master the group broke, and enter the group of survivors its plan
        names (this member is in it from here on: a failure before its first step is
        reported for it). A member the plan leaves out exits."""
        plan = self.master.ReportLost(
            pb.LostReport(
                worker_id=self.me, version=self.group.version, completed_step=completed_step,
                holds_result=holds_result, unreported=unreported, cause=str(lost),
                suspect=lost.worker if lost.timed_out and lost.worker is not None else -1,
            ),
            timeout=120,
        )  # fmt: skip
        new = group_of(plan.group)
        if self.me not in {w for w, _ in new.members}:
            raise SystemExit(f"worker {self.me} is out of the group after a failure")
        self.group = new
        return plan

    def send_result(self, plan: pb.RecoveryPlan, held: tuple) -> None:
        """Send the step this member completed, `held` (step, sums, table), to the
        members one step behind."""
        step, summed, table = held
        for worker in plan.behind:
            address = dict(self.group.members)[worker]
            send_arrays(
                address, self.env.token, self.group.version, self.me, worker,
                [np.array([step]), summed, table], RING_TIMEOUT, tls=self.env.tls,
            )  # fmt: skip

    def receive_result(self, plan: pb.RecoveryPlan, expected: int) -> tuple:
        """The step this member is behind by, (step, sums, table), from the plan's
        source; it must be step `expected`."""
        arrays = receive_arrays(self.listener, self.group.version, plan.source, RING_TIMEOUT * 4)
        step, summed, table = int(arrays[0][0]), arrays[1], arrays[2]
        if step != plan.step or step != expected:
            raise RuntimeError(f"recovery sent step {step}; expected {plan.step}")
        return step, summed, table


def group_of(info: pb.GroupInfo) -> Group:
    """The group a master's `GroupInfo` describes."""
    return Group(info.version, tuple((m.worker, m.address) for m in info.members))
