"""The parameter server: holds one shard of the model and applies the optimizer.

`process.py` is its life; `store.py` the variables and embedding rows with their
optimizer state; `service.py` the gRPC face; `checkpoints.py` and `ledger.py` what it
writes so that a relaunched PS restores its shard and exactly-once can be checked.
"""
