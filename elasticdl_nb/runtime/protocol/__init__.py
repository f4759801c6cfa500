"""The job's gRPC protocol: generated stubs, tensor encoding, authentication and peer
names (auth.py), channels and listeners that bind their own ports (channels.py), retries
within a deadline (patience.py), and the framed TCP transport beside gRPC (frames.py,
bulk.py).

`elasticdl.proto` is the source of truth; `python -m elasticdl_nb.runtime.protocol.generate`
regenerates the `*_pb2*.py` stubs beside it (a test checks they are current).
Import the stubs as `from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb`.
"""
