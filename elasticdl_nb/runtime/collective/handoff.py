"""Arrays from one member to another, point to point, bit for bit: a step's reduced
gradients to the survivors one step behind after a failure, and the model and optimizer
state to a worker that joins (from a peer, not from disk).

The sender connects to the receiver's `RingListener` (purpose "handoff"); one frame
carries the arrays' dtypes and shapes and their raw bytes.
"""

from __future__ import annotations

import json

import numpy as np

from elasticdl_nb.runtime.collective.ring import PeerLost, RingListener, connect
from elasticdl_nb.runtime.protocol.frames import recv_frame, send_frame
from elasticdl_nb.runtime.protocol.tls import JobTls


def send_arrays(
    address: str, token: str, version: int, me: int, peer: int, arrays: list[np.ndarray],
    timeout: float, purpose: str = "handoff", tls: JobTls | None = None,
) -> None:  # fmt: skip
    """Send `arrays` to member `peer` (listening at `address`) as `me` in `version`.
    `purpose`: "handoff" (the receiver names the sender) or "state" (it takes anyone's)."""
    arrays = [np.asarray(a, order="C") for a in arrays]  # (ascontiguousarray makes 0-d 1-d)
    layout = [[a.dtype.str, list(a.shape)] for a in arrays]
    sock = connect(address, token, version, me, peer, timeout, purpose=purpose, tls=tls)
    try:
        send_frame(sock, json.dumps(layout).encode(), arrays)
    except OSError as exc:
        raise PeerLost(peer, f"handoff failed: {exc}") from None
    finally:
        sock.close()


def receive_arrays(
    listener: RingListener, version: int, source: int, timeout: float
) -> list[np.ndarray]:
    """The arrays member `source` sends this member in `version`."""
    return _read(listener.take(version, source, timeout, purpose="handoff"), source, timeout)


def receive_state(listener: RingListener, timeout: float) -> tuple[int, list[np.ndarray]]:
    """(version, arrays) of the first "state" handoff from any member."""
    version, source, sock = listener.take_any("state", timeout)
    return version, _read(sock, source, timeout)


def _read(sock, source: int, timeout: float) -> list[np.ndarray]:
    try:
        _, message, buffers = recv_frame(sock, timeout, timeout)
    except OSError as exc:
        raise PeerLost(source, f"handoff failed: {exc}") from None
    finally:
        sock.close()
    layout = json.loads(message)
    return [
        raw.view(np.dtype(dtype)).reshape(shape)
        for (dtype, shape), raw in zip(layout, buffers, strict=True)
    ]
