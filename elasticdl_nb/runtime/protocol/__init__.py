"""The job's gRPC protocol: generated stubs, tensor encoding, authentication, channels.

`elasticdl.proto` is the source of truth; `python -m elasticdl_nb.runtime.protocol.generate`
regenerates the `*_pb2*.py` stubs beside it (a test checks they are current).
Import the stubs as `from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb`.
"""
