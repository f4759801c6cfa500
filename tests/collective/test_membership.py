"""The master's record of the allreduce group: versions as workers join and leave, and
the one decision all survivors of a failure follow (nobody rolled back, nobody applying
a step twice)."""

from __future__ import annotations

import pytest

from elasticdl_nb.runtime.collective.membership import Membership, Report


def grown(*workers: int) -> Membership:
    membership = Membership()
    for w in workers:
        membership.join(w, f"127.0.0.1:{5000 + w}")
    membership.propose()
    return membership


def test_joiners_and_leavers_make_the_next_version_with_the_ring_order_kept():
    membership = grown(0, 1, 2)
    assert membership.version == 1
    assert [w for w, _ in membership.current.members] == [0, 1, 2]
    assert membership.propose() is None  # nothing changed
    membership.join(7, "127.0.0.1:5007")
    membership.leave(1)
    group = membership.propose()
    assert group.version == 2 and [w for w, _ in group.members] == [0, 2, 7]
    assert membership.groups[1].members != group.members  # old versions are kept


def test_survivors_one_step_apart_all_end_at_the_later_step_from_one_source():
    membership = grown(0, 1, 2, 3)
    membership.dead(2)  # the backend saw it die
    # Worker 3 had applied step 41 before the ring broke in step 42; 0 and 1 had not.
    assert membership.report(1, Report(0, 40, holds_result=True)) is None
    assert membership.report(1, Report(3, 41, holds_result=True)) is None
    recovery = membership.report(1, Report(1, 40, holds_result=True))
    assert recovery is not None
    assert [w for w, _ in recovery.group.members] == [0, 1, 3]
    assert recovery.group.version == 2 and membership.version == 2
    assert (recovery.step, recovery.source, recovery.behind) == (41, 3, (0, 1))
    assert recovery.lost == (2,)
    # A survivor asking again gets the same decision.
    assert membership.report(1, Report(0, 40, holds_result=True)) is recovery


def test_when_nobody_got_ahead_there_is_nothing_to_hand_on():
    membership = grown(0, 1, 2)
    membership.dead(1)
    membership.report(1, Report(0, 9, holds_result=True))
    recovery = membership.report(1, Report(2, 9, holds_result=True))
    assert (recovery.step, recovery.source, recovery.behind) == (9, None, ())


def test_a_member_that_never_reports_is_out_once_the_master_settles():
    membership = grown(0, 1, 2)  # 1 hangs: the backend has not seen it die
    assert membership.report(1, Report(0, 5, holds_result=True)) is None
    assert membership.report(1, Report(2, 5, holds_result=True)) is None
    assert membership.propose() is None  # no joining while a failure is unsettled
    recovery = membership.settle(1)
    assert [w for w, _ in recovery.group.members] == [0, 2] and recovery.lost == (1,)
    assert membership.settle(1) is recovery


def test_an_inconsistent_account_is_refused_rather_than_followed():
    membership = grown(0, 1, 2)
    membership.dead(2)
    membership.report(1, Report(0, 5, holds_result=True))
    with pytest.raises(AssertionError, match="more than one step apart"):
        membership.report(1, Report(1, 7, holds_result=True))


def test_a_dead_member_blocks_growth_until_the_survivors_recover_and_joiners_come_along():
    membership = Membership()
    for w in (0, 1, 2):
        membership.join(w, f"h:{w}")
    membership.propose()
    membership.dead(2)
    membership.join(5, "h:5")
    assert membership.propose() is None  # the recovery makes the next version
    membership.report(1, Report(0, 9, True))
    recovery = membership.report(1, Report(1, 9, True))
    assert [w for w, _ in recovery.group.members] == [0, 1, 5]
    assert recovery.lost == (2,) and recovery.group.version == 2


def test_a_failure_while_members_switch_to_a_join_is_one_decision_for_both_versions():
    membership = Membership()
    for w in (0, 1, 2):
        membership.join(w, f"h:{w}")
    membership.propose()
    membership.join(7, "h:7")
    assert membership.propose().version == 2  # members switch to it one by one ...
    membership.dead(1)  # ... when worker 1 dies: 0 was still in version 1, 2 and 7 in 2
    assert membership.report(1, Report(0, 9, False)) is None
    assert membership.report(2, Report(2, 10, True)) is None
    recovery = membership.report(2, Report(7, 10, False))
    assert recovery is membership.report(1, Report(0, 9, False))  # asked again: the same
    assert [w for w, _ in recovery.group.members] == [0, 2, 7]
    assert (recovery.step, recovery.source, recovery.behind) == (10, 2, (0,))
    assert recovery.lost == (1,) and recovery.joiners == ()
