"""A Kubernetes job's traffic is encrypted (issue 20), seen from the real node's bridge.

`tcpdump` records every frame on the bridge the pods hang off while a job trains; the
capture is saved (in the test's directory), its TCP connections between pods are put
back together, and searched: they hold the workers' bulk exchanges with the PS (their
TLS handshakes name "ps-0" in the clear, and megabytes follow), and neither the job's
token nor the bytes of a tensor the model starts with (a bias layer set to a marker
value, which the workers pull from the PS at their first step). The test's own probes
from the host (below), which send the token in plaintext on purpose, are the connections
with the host's bridge address at one end: they are left out of that search, and serve
as its control (the search does find the token there, in the clear).

While the job runs, its PS is probed from the host at its pod's address with the job's
token: in plaintext, and with certificates of another job's authority, it refuses; with
the notebook's certificate it answers under the name "ps-0". Its pod is then deleted at a
random step; the relaunched PS, at a new address, answers under the same name, and the
job ends with every record applied once.
"""

from __future__ import annotations

import signal
import socket
import ssl
import struct
import subprocess
import time

import grpc
import numpy as np
import pytest

import elasticdl_nb as edl
from elasticdl_nb.backends import job_records
from elasticdl_nb.backends.kubernetes import manifests as m
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol import elasticdl_pb2_grpc as rpc
from elasticdl_nb.runtime.protocol import tls
from elasticdl_nb.runtime.protocol.bulk import BulkClient, BulkError
from elasticdl_nb.runtime.protocol.channels import open_channel
from elasticdl_nb.runtime.ps.ledger import ledger_problems
from tests.integration.faults import fault_rng, wait_for, wait_for_step
from tests.integration.models import DIGITS, digits_split, paced_loss
from tests.kubernetes.job_pods import k8s_options
from tests.kubernetes.node import BRIDGE, POD_GATEWAY

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

MARKER = np.float32(0.0123456789)  # the first layer's every bias, until the first update
MARKED = np.full(4, MARKER).tobytes()  # 16 bytes no encrypted stream holds by chance
EPOCHS = 10
STEPS = EPOCHS * (1400 // 32 + 1)


def marked_model():
    import keras

    marker = keras.initializers.Constant(0.0123456789)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu", bias_initializer=marker),
            keras.layers.Dense(10),
        ]
    )


class Capture:
    """tcpdump on the bridge, whole frames, written to `path` as they come."""

    def __init__(self, path):
        self.path = path
        self._proc = subprocess.Popen(
            ["tcpdump", "-i", BRIDGE, "-n", "-s", "0", "-U", "-w", str(path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self._proc.stderr.readline()  # "listening on edlnb0, ..." once it captures
        assert "listening on" in line, line

    def stop(self) -> bytes:
        self._proc.send_signal(signal.SIGINT)
        summary = self._proc.communicate(timeout=30)[1]
        print(f"tcpdump: {summary.strip()}")
        return self.path.read_bytes()


def tcp_segments(pcap: bytes):
    """((source ip, port), (destination ip, port), payload) of every IPv4 TCP segment in
    a pcap file of Ethernet frames (tcpdump's on a bridge)."""
    magic = struct.unpack("<I", pcap[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    at = 24
    while at + 16 <= len(pcap):
        _, _, captured, _ = struct.unpack(endian + "IIII", pcap[at : at + 16])
        frame = pcap[at + 16 : at + 16 + captured]
        at += 16 + captured
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue  # not IPv4 TCP
        ip = frame[14:]
        ip_len = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ip_len:total]
        sport, dport = struct.unpack("!HH", tcp[:4])
        source, destination = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        yield (source, sport), (destination, dport), tcp[(tcp[12] >> 4) * 4 :]


def tcp_streams(pcap: bytes) -> tuple[dict[tuple, bytes], dict[tuple, bytes]]:
    """Each direction of each TCP connection, its payload bytes in the order captured (a
    retransmitted segment appears twice: no matter for a search): (those between two
    pods, those with the host at one end)."""
    streams: dict[tuple, bytearray] = {}
    for source, destination, payload in tcp_segments(pcap):
        if payload:
            streams.setdefault((source, destination), bytearray()).extend(payload)
    pods, host = {}, {}
    for (source, destination), data in streams.items():
        side = host if POD_GATEWAY in (source[0], destination[0]) else pods
        side[(source, destination)] = bytes(data)
    return pods, host


def ps_pod(core, namespace: str, name: str):
    pods = core.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_JOB}={name},"
                                    f"{m.LABEL_ROLE}=ps").items  # fmt: skip
    live = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return live[0] if live else None


def served_name(ip: str, notebook: tls.JobTls, name: str) -> str:
    """The name on the certificate the PS at `ip` shows, checked against `name`."""
    with socket.create_connection((ip, m.PS_BULK_PORT), timeout=10) as raw:
        with notebook.client_socket(raw, name) as secure:
            subject = dict(field[0] for field in secure.getpeercert()["subject"])
    return subject["commonName"]


def probe_refusals(ip: str, token: str, other_job: tls.JobTls) -> None:
    """The PS at `ip` refuses the right token in plaintext, and another job's
    certificates, on its gRPC port and on its bulk channel."""
    for credentials in (None, other_job):
        stub = rpc.ParameterServerStub(
            open_channel(f"{ip}:{m.PS_PORT}", token, "ps-0", tls=credentials)
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetBulkEndpoint(pb.Empty(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        bulk = BulkClient(ip, token, "ps-0", lambda: m.PS_BULK_PORT, timeout=10, tls=credentials)
        with pytest.raises(BulkError):
            bulk.push_pull(pb.PushPullRequest())
        bulk.close()


def test_pod_traffic_is_encrypted_and_a_relaunched_ps_keeps_its_name(
    job_home, job_namespace, real_node, real_cluster, real_admin, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(real_admin)
    rng = fault_rng("kubernetes-tls")
    delete_at = rng.randrange(40, STEPS // 2)
    (x, y), (xt, yt) = digits_split()
    other_files = tls.issue(tls.job_names(1), "another-job")
    other_job = tls.JobTls(*(other_files[f] for f in tls.files_of(tls.WORKER)))

    capture = Capture(tmp_path / "bridge.pcap")
    try:
        job = edl.train(
            marked_model,
            **{**DIGITS, "loss": paced_loss},
            data=(x, y),
            validation_data=(xt, yt),
            workers=2,
            epochs=EPOCHS,
            minibatch_size=32,
            checkpoint_steps=25,
            record_ledger=True,
            **k8s_options(real_cluster, job_namespace, tmp_path),
        )
        record = job_records.find_job(job.name)
        notebook = record.tls
        assert notebook is not None, "the notebook keeps its own certificate"
        kept = sorted(p.name for p in record.files.tls.iterdir())
        assert kept == sorted(tls.files_of(tls.NOTEBOOK)), "no other key stays here"

        wait_for_step(job, 5, timeout=300)
        first = wait_for(lambda: ps_pod(core, job_namespace, job.name), 60, "the PS pod")
        probe_refusals(first.status.pod_ip, record.token, other_job)
        assert served_name(first.status.pod_ip, notebook, "ps-0") == "ps-0"
        with pytest.raises(ssl.SSLCertVerificationError):
            served_name(first.status.pod_ip, notebook, "ps-1")

        wait_for_step(job, delete_at, timeout=300)
        core.delete_namespaced_pod(first.metadata.name, job_namespace)
        print(f"step {delete_at}: deleted {first.metadata.name} ({first.status.pod_ip})")

        def relaunched():
            pod = ps_pod(core, job_namespace, job.name)
            return pod if pod is not None and pod.metadata.uid != first.metadata.uid else None

        second = wait_for(relaunched, 180, "the relaunched PS pod")
        deadline = time.monotonic() + 120
        while True:  # running is not listening yet: the PS restores its checkpoint first
            try:
                name = served_name(second.status.pod_ip, notebook, "ps-0")
                break
            except OSError:
                assert time.monotonic() < deadline, "the relaunched PS does not serve TLS"
                time.sleep(0.5)
        print(f"relaunched PS at {second.status.pod_ip} serves {name!r}")
        assert name == "ps-0"

        final = job.wait(timeout=600)
    finally:
        pcap = capture.stop()
    assert final["state"] == "succeeded", final
    assert final["metrics"]["accuracy"] >= 0.85
    assert ledger_problems(job.dir, 1, [len(x)], EPOCHS) == []

    streams, probes = tcp_streams(pcap)
    bulk = [s for (src, dst), s in streams.items() if m.PS_BULK_PORT in (src[1], dst[1])]
    print(f"capture: {len(pcap):,} bytes, {len(streams)} pod-to-pod streams, "
          f"{sum(map(len, bulk)):,} bytes on bulk channels; saved in {capture.path}")  # fmt: skip
    # It saw the workers' traffic with the PS: their handshakes, then the exchanges ...
    assert any(b"ps-0" in s for s in bulk), "no TLS handshake naming ps-0 was captured"
    assert sum(map(len, bulk)) > 2_000_000
    # ... and nothing between pods in the clear, where the same search finds the token
    # the plaintext probe sent from the host.
    assert any(record.token.encode() in s for s in probes.values()), "the control failed"
    for (src, dst), stream in streams.items():
        assert record.token.encode() not in stream, f"the token in clear from {src} to {dst}"
        assert MARKED not in stream, f"tensor bytes in clear from {src} to {dst}"
