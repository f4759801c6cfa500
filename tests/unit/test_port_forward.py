"""The port-forward relay: each local connection gets its own stream to the pod, bytes go
both ways, and a stream that cannot be opened closes the local connection (no hang).
The pod end is a real TCP server here; the API server's websocket stream is what the
`kubernetes` client provides in its place."""

from __future__ import annotations

import socket
import threading

from elasticdl_nb.backends.kubernetes.port_forward import PortForward


def echo_server() -> tuple[socket.socket, str]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def test_bytes_go_both_ways_on_concurrent_connections_each_with_its_own_stream():
    server, pod = echo_server()
    opened = []

    def open_stream():
        opened.append(1)
        return _connect(pod)

    forward = PortForward(open_stream)
    try:
        clients = [_connect(forward.address) for _ in range(3)]
        payloads = [bytes([i]) * 300_000 for i in range(3)]
        for client, payload in zip(clients, payloads, strict=True):
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
        for client, payload in zip(clients, payloads, strict=True):
            received = b""
            while chunk := client.recv(65536):
                received += chunk
            assert received == payload
            client.close()
        assert len(opened) == 3
    finally:
        forward.close()
        server.close()


def test_a_stream_that_cannot_be_opened_closes_the_local_connection():
    def refuse():
        raise ConnectionRefusedError("pods/portforward is forbidden")

    forward = PortForward(refuse)
    try:
        client = _connect(forward.address)
        assert client.recv(1) == b""  # closed at once, not left hanging
        # ... and why is kept, for the job's status to say.
        assert forward.failure == "ConnectionRefusedError: pods/portforward is forbidden"
    finally:
        forward.close()
