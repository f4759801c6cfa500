"""The bulk channel over real loopback sockets: framing, the token check, dead peers."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import numpy as np
import pytest

from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.bulk import BulkClient, BulkError
from elasticdl_nb.runtime.protocol.bulk_server import BulkServer
from elasticdl_nb.runtime.protocol.frames import (
    READY,
    FrameError,
    hello,
    recv_frame,
    send_frame,
)
from elasticdl_nb.runtime.protocol.tensors import OUT_OF_BAND_MIN_BYTES, to_array, to_tensor

TOKEN = "s3cret"
rng = np.random.default_rng(0)
ARRAYS = {
    "scalar": np.float64(2.5) * np.ones(()),
    "empty": np.zeros((0, 16), np.float32),
    "small_i64": np.arange(12, dtype=np.int64).reshape(3, 4),
    "half": rng.normal(size=(2, 3, 5)).astype(np.float16),
    "big_f32": rng.standard_normal((700, 1000), dtype=np.float32),  # 2.7 MB
    "big_i32": np.arange(300_000, dtype=np.int32).reshape(1000, 300),
    "big_bool": rng.random((512, 1024)) > 0.5,
    "transposed": np.arange(200_000, dtype=np.float64).reshape(400, 500).T,
}


def request_of(arrays: dict[str, np.ndarray]) -> tuple[pb.PushPullRequest, list[np.ndarray]]:
    out: list[np.ndarray] = []
    request = pb.PushPullRequest(batch_key=7)
    for name, array in arrays.items():
        to_tensor(array, request.dense_grads[name], out)
    return request, out


class Recorder:
    """Stands in for a socket to capture a frame's bytes (to send only part of them)."""

    def __init__(self):
        self.data = bytearray()

    def sendall(self, data) -> None:
        self.data += data


def frame_bytes(message: bytes, buffers: list[np.ndarray]) -> bytes:
    recorder = Recorder()
    send_frame(recorder, message, buffers)
    return bytes(recorder.data)


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def test_frames_round_trip_arrays_of_every_kind_over_a_socket():
    request, out = request_of(ARRAYS)
    inline = {n for n, t in request.dense_grads.items() if not t.out_of_band}
    assert inline == {"scalar", "empty", "small_i64", "half"}
    assert all(a.nbytes >= OUT_OF_BAND_MIN_BYTES for a in out)
    assert request.ByteSize() < 10_000  # the big ones are not in the message
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=send_frame, args=(left, request.SerializeToString(), out))
        sender.start()
        kind, message, buffers = recv_frame(right, 10, 10)
        sender.join()
    back = pb.PushPullRequest.FromString(message)
    assert kind == 0 and back.batch_key == 7 and len(buffers) == len(out)
    decoded = {n: to_array(t, buffers) for n, t in back.dense_grads.items()}
    assert_same(decoded, ARRAYS)
    assert not decoded["big_f32"].flags.writeable


def test_an_out_of_band_tensor_without_its_buffer_is_an_error():
    tensor = to_tensor(ARRAYS["big_f32"], out_of_band=[])
    with pytest.raises(ValueError, match="buffer 1 of 0"):
        to_array(tensor)


class Echo:
    """A handler that sends the request's tensors back as the reply's dense values."""

    def __init__(self):
        self.calls = 0

    def __call__(self, request, buffers):
        self.calls += 1
        if request.batch_key < 0:
            raise BulkError(grpc.StatusCode.INVALID_ARGUMENT, "negative key")
        reply, out = pb.PushPullResponse(version=request.batch_key), []
        for name, tensor in request.dense_grads.items():
            to_tensor(to_array(tensor, buffers), reply.dense[name], out)
        return reply, out


@pytest.fixture
def server():
    echo = Echo()
    server = BulkServer("127.0.0.1", TOKEN, "ps-0", echo, timeout=5).start()
    server.echo = echo
    yield server
    server.stop()


def client_of(
    server: BulkServer, token: str = TOKEN, timeout: float = 5, peer: str = "ps-0"
) -> BulkClient:
    return BulkClient("127.0.0.1", token, peer, lambda: server.port, timeout=timeout)


def test_exchanges_reuse_one_connection_per_thread_and_return_the_same_values(server):
    client = client_of(server)
    for _ in range(3):
        reply, buffers = client.push_pull(*request_of(ARRAYS))
        assert reply.version == 7
        assert_same({n: to_array(t, buffers) for n, t in reply.dense.items()}, ARRAYS)
    assert len(client._open) == 1

    def other_thread():
        client.push_pull(*request_of({"x": ARRAYS["big_i32"]}))

    threads = [threading.Thread(target=other_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(client._open) == 4 and server.echo.calls == 6
    client.close()


def test_a_refused_request_raises_its_status_code_and_the_connection_lives_on(server):
    client = client_of(server)
    with pytest.raises(BulkError) as refused:
        client.push_pull(pb.PushPullRequest(batch_key=-1))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(refused.value, grpc.RpcError)
    assert client.push_pull(pb.PushPullRequest(batch_key=3))[0].version == 3
    assert len(client._open) == 1


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "token, peer", [("wrong", "ps-0"), ("s3cret-but-longer", "ps-0"), ("", "ps-0"), (TOKEN, "ps-1")]
)
def test_a_wrong_token_or_another_ps_is_refused_and_nothing_is_processed(server, token, peer):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(hello(token, peer))
        request, out = request_of({"x": ARRAYS["small_i64"]})
        try:
            send_frame(sock, request.SerializeToString(), out)
        except OSError:
            pass  # already closed
        assert _closed_by_peer(sock)
    with pytest.raises(BulkError) as refused:
        client_of(server, token, peer=peer).push_pull(pb.PushPullRequest(batch_key=1))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.echo.calls == 0


def test_a_frame_without_the_hello_is_refused(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        send_frame(sock, pb.PushPullRequest(batch_key=1).SerializeToString())
        assert _closed_by_peer(sock)
    assert server.echo.calls == 0


def test_a_client_dying_mid_frame_is_dropped_without_processing(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(hello(TOKEN, "ps-0"))
        assert sock.recv(1) == READY
        request, out = request_of({"x": ARRAYS["big_f32"]})
        sock.sendall(frame_bytes(request.SerializeToString(), out)[:100_000])
    deadline = time.monotonic() + 5
    while server._conns and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server._conns and server.echo.calls == 0
    assert client_of(server).push_pull(pb.PushPullRequest(batch_key=2))[0].version == 2


class HalfServer:
    """Accepts the hello, reads a request, sends half a reply frame, then dies or hangs."""

    def __init__(self, then: str):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.then = then
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        conn, _ = self.listener.accept()
        conn.recv(len(hello(TOKEN, "ps-0")))
        conn.sendall(READY)
        recv_frame(conn, 5, 5)
        reply, out = pb.PushPullResponse(), []
        to_tensor(ARRAYS["big_f32"], reply.dense["x"], out)
        conn.sendall(frame_bytes(reply.SerializeToString(), out)[:50_000])
        if self.then == "hang":
            time.sleep(10)
        conn.close()


@pytest.mark.parametrize(
    "then, code",
    [("die", grpc.StatusCode.UNAVAILABLE), ("hang", grpc.StatusCode.DEADLINE_EXCEEDED)],
)
def test_a_server_failing_mid_reply_raises_a_clear_error_without_hanging(then, code):
    peer = HalfServer(then)
    client = BulkClient("127.0.0.1", TOKEN, "ps-0", lambda: peer.port, timeout=1)
    start = time.monotonic()
    with pytest.raises(BulkError) as failed:
        client.push_pull(pb.PushPullRequest(batch_key=1))
    assert time.monotonic() - start < 5
    assert failed.value.code() == code
    if then == "die":
        assert "closed the connection" in failed.value.details()
    assert not client._open and client._port is None  # reconnects (asking for the port)


def test_a_stopped_server_is_unavailable(server):
    client = client_of(server)
    assert client.push_pull(pb.PushPullRequest(batch_key=1))[0].version == 1
    server.stop()
    for _ in range(2):  # the broken connection, then the refused reconnect
        with pytest.raises(BulkError) as failed:
            client.push_pull(pb.PushPullRequest(batch_key=1))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_frame_errors_are_connection_errors():
    assert issubclass(FrameError, ConnectionError)
