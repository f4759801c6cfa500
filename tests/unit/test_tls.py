"""A job's TLS material (protocol/tls.py) on real gRPC servers and real sockets: the job's
own certificates connect, under the name meant; a client without a certificate, with one
from another job's authority, or meaning another name is refused at the handshake."""

from __future__ import annotations

import socket
import ssl
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest

from elasticdl_nb.runtime.protocol.frames import listen_socket, recv_frame, send_frame
from elasticdl_nb.runtime.protocol.tls import JobTls, cert_file, issue, key_file

NAMES = ["master", "ps-0", "worker"]
ECHO = "/test.Echo/Say"


@pytest.fixture(scope="module")
def job_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    for file, data in issue(NAMES, "job-a").items():
        (directory / file).write_bytes(data)
    return directory


def _tls(directory, name) -> JobTls:
    return JobTls.load(directory, name)


def _other_job(name: str) -> JobTls:
    files = issue([name], "job-b")
    return JobTls(files["ca.crt"], files[cert_file(name)], files[key_file(name)])


@pytest.fixture(scope="module")
def ps0_server(job_files):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Echo", {"Say": echo})]
    )
    port = server.add_secure_port("127.0.0.1:0", _tls(job_files, "ps-0").server_credentials())
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def _call(address: str, credentials, peer: str) -> bytes:
    options = JobTls.channel_options(peer)
    with grpc.secure_channel(address, credentials, options=options) as channel:
        say = channel.unary_unary(ECHO)
        return say(b"hello", timeout=10)


def test_grpc_between_two_processes_of_the_job(job_files, ps0_server):
    worker = _tls(job_files, "worker")
    assert _call(ps0_server, worker.channel_credentials(), "ps-0") == b"hello"


@pytest.mark.parametrize("client", ["no certificate", "another job's", "meaning ps-1"])
def test_grpc_refuses_at_the_handshake(job_files, ps0_server, client):
    worker = _tls(job_files, "worker")
    peer = "ps-0"
    if client == "no certificate":  # trusts the job's authority, shows nothing of its own
        credentials = grpc.ssl_channel_credentials(root_certificates=worker.ca)
    elif client == "another job's":  # (which also does not trust this job's server)
        other = _other_job("worker")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=worker.ca, private_key=other.key, certificate_chain=other.cert
        )
    else:
        credentials, peer = worker.channel_credentials(), "ps-1"
    with pytest.raises(grpc.RpcError) as refused:
        _call(ps0_server, credentials, peer)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def _framed_server(tls: JobTls, received: list):
    """A listener that serves one TLS connection: one frame in, the same frame back."""
    listener = listen_socket("127.0.0.1")

    def serve():
        conn, _ = listener.accept()
        try:
            with tls.server_socket(conn) as secure:
                kind, message, buffers = recv_frame(secure, 10, 10)
                received.append((bytes(message), buffers))
                send_frame(secure, bytes(message), buffers)
        except (ssl.SSLError, OSError) as err:
            received.append(err)
        finally:
            listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_frames_travel_over_tls_with_large_buffers(job_files):
    received: list = []
    port = _framed_server(_tls(job_files, "ps-0"), received)
    tensor = np.arange(4 << 20, dtype=np.float32)  # 16 MiB: many TLS records
    worker = _tls(job_files, "worker")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with worker.client_socket(raw, "ps-0") as secure:
            send_frame(secure, b"push", [tensor])
            _, message, buffers = recv_frame(secure, 10, 10)
    assert message == b"push"
    np.testing.assert_array_equal(buffers[0].view(np.float32), tensor)


@pytest.mark.parametrize("client", ["another job's", "meaning master"])
def test_frames_refuse_a_stranger_at_the_handshake(job_files, client):
    received: list = []
    port = _framed_server(_tls(job_files, "ps-0"), received)
    if client == "another job's":
        other = _other_job("worker")
        tls, name = JobTls(_tls(job_files, "worker").ca, other.cert, other.key), "ps-0"
    else:
        tls, name = _tls(job_files, "worker"), "master"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with tls.client_socket(raw, name) as secure:
                send_frame(secure, b"push")
                recv_frame(secure, 10, 10)
