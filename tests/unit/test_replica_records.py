"""The allreduce replicas' records and their check: it finds replicas that differ, ledgers
that disagree, and minibatches applied twice or never."""

from elasticdl_nb.runtime.worker.replica_records import ReplicaRecords, replica_problems


def _two_replicas(tmp_path, second_ledger=None, second_sum="abc"):
    a, b = ReplicaRecords(tmp_path, 0, True), ReplicaRecords(tmp_path, 1, True)
    steps = {1: [(0, 0, 0), (0, 0, 10)], 2: [(0, 0, 20)]}  # 25 records, minibatches of 10
    for step, minibatches in steps.items():
        a.applied(step, minibatches)
        b.applied(step, (second_ledger or steps)[step])
    a.checksum("end", 1, 2, "abc", 0.1)
    b.checksum("end", 1, 2, second_sum, 0.1)
    return tmp_path


def test_identical_replicas_that_applied_everything_once_pass(tmp_path):
    assert replica_problems(_two_replicas(tmp_path), [25], 10, 1) == []


def test_differing_checksums_and_ledgers_and_a_minibatch_applied_twice_are_found(tmp_path):
    ledger = {1: [(0, 0, 0), (0, 0, 10)], 2: [(0, 0, 10)]}
    problems = replica_problems(_two_replicas(tmp_path, ledger, "xyz"), [25], 10, 1)
    assert problems == [
        "replicas of group 1 differ at step 2: 2",
        "worker 1's ledger differs from another's at step 2",
    ]
    # Worker 1 alone: minibatch 10 twice, 20 never.
    (tmp_path / "replicas" / "worker-0.ledger").unlink()
    assert replica_problems(tmp_path, [25], 10, 1)[1:] == [
        "epoch 0 source 0 minibatch at 10: applied 2 times (steps [1, 2])",
        "epoch 0 source 0 minibatch at 20: applied 0 times (steps [])",
    ]
