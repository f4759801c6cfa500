"""The worker: trains on the tasks the master hands it.

`process.py` is its life; `trainer.py` runs the PS strategy (pull, compute, push over
`ps_client.py`), `lockstep.py` the allreduce strategy (one replica per worker, kept equal
step by step; `group_link.py`: its group, ring and transfers); `task_feed.py`,
`batches.py` and `reporter.py` are how tasks come in and progress goes out.
"""
