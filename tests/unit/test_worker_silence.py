"""Which task holders the master gives up on: silent longer than the budget, counted from
their last word, or from the first look for a holder not heard from yet."""

from elasticdl_nb.runtime.master.worker_silence import WorkerSilence


def test_a_holder_silent_past_the_budget_is_overdue_and_speaking_resets_it():
    now = [100.0]
    silence = WorkerSilence(seconds=30, clock=lambda: now[0])
    silence.heard(1)
    silence.heard(2)
    now[0] = 125.0
    silence.heard(2)
    now[0] = 130.5
    assert silence.overdue({1, 2}) == [(1, 30.5)]
    assert silence.overdue({2}) == []  # worker 1 holds nothing: not judged
    silence.forget(1)
    assert silence.overdue({1}) == []  # counted from now: a new master's first look
    now[0] = 161.0
    assert silence.overdue({1, 2}) == [(1, 30.5), (2, 36.0)]
