"""Transport security for a job's connections: mutual TLS with a per-job authority.

Each job gets its own certificate authority at submit, and from it one certificate per
name a process of the job answers to: "master", "ps-0", "ps-1", ..., "worker" (every
worker: they come and go, and the token hello already names the member meant), and
"notebook". Every certificate serves both ways (server and client authentication), so a
process presents the same one when it listens and when it calls: every connection is
mutual TLS, and a peer without a certificate of this job's authority is refused at the
handshake, before any token is read. The job token is still checked on top.

Clients check the server's certificate against the name they mean to reach, not the
address (`ssl_target_name_override` for gRPC, `server_hostname` for `ssl`): a PS that is
relaunched at another address still answers to "ps-0". The authority's private key is
not kept: nothing is signed after submit.

Keys are EC P-256 (what TLS 1.3 handshakes fastest with); made by `cryptography`, used by
gRPC's own TLS and Python's `ssl`: nothing here does cryptography itself.

Where the files live: a local job's in its job directory (`tls/`, owner-only); a
Kubernetes job's in its Secret, each pod mounting only the authority's certificate and
its own role's pair. A process finds them through `TLS_DIR_ENV` (process_env.py); no
such directory means plaintext, a local job's default.
"""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
# The names a job's certificates answer to (ps_name(i) for each PS).
MASTER, WORKER, NOTEBOOK = "master", "worker", "notebook"
# A job's certificates outlive any job we expect; a job running longer must be resubmitted.
VALIDITY = datetime.timedelta(days=365)


def ps_name(index: int) -> str:
    return f"ps-{index}"


def job_names(parameter_servers: int) -> list[str]:
    """Every name a job with that many PS has a certificate for."""
    return [MASTER, WORKER, NOTEBOOK, *(ps_name(i) for i in range(parameter_servers))]


def files_of(name: str) -> list[str]:
    """The files a process named `name` needs: the authority's certificate, its own pair."""
    return [CA_FILE, cert_file(name), key_file(name)]


def cert_file(name: str) -> str:
    return f"{name}.crt"


def key_file(name: str) -> str:
    return f"{name}.key"


def issue(names: list[str], job: str) -> dict[str, bytes]:
    """A new authority for `job` and a certificate and key for each of `names`, as files
    ({file name: PEM bytes}: `CA_FILE`, `cert_file(name)`, `key_file(name)})."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"elasticdl-nb job {job}")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = {CA_FILE: _pem(ca)}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(subject, ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        files[cert_file(name)] = _pem(cert)
        files[key_file(name)] = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    return files


def write(directory: Path, files: dict[str, bytes]) -> None:
    """`issue`'s files into `directory`, readable by their owner only."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for file, data in files.items():
        fd = os.open(directory / file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)


def _builder(subject, issuer, public_key, now) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # (clocks a little apart)
        .not_valid_after(now + VALIDITY)
    )


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class JobTls:
    """The job's authority and this process's certificate and key (PEM)."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, directory: Path, name: str) -> JobTls:
        """The files `issue` made for `name`, from `directory` (a mounted Secret, or the
        job directory of a local job)."""
        read = lambda file: (directory / file).read_bytes()  # noqa: E731
        return cls(read(CA_FILE), read(cert_file(name)), read(key_file(name)))

    # ---------------------------------------------------------------- gRPC

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    @staticmethod
    def channel_options(peer: str) -> list[tuple[str, str]]:
        """Check the server's certificate against `peer`, the name meant, not the address."""
        return [("grpc.ssl_target_name_override", peer)]

    # ---------------------------------------------------------------- raw sockets
    # (one context per process and side: making one parses the PEM again)

    @cached_property
    def server_context(self) -> ssl.SSLContext:
        context = self._context(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    @cached_property
    def client_context(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_CLIENT)  # (checks the name it is given)

    def client_socket(self, sock: socket.socket, peer: str) -> ssl.SSLSocket:
        """`sock` after a handshake with the server named `peer` (ssl.SSLError, an
        OSError, if it is not that name of this job, or refuses our certificate)."""
        return self.client_context.wrap_socket(sock, server_hostname=peer)

    def server_socket(self, conn: socket.socket) -> ssl.SSLSocket:
        """An accepted `conn` after the handshake (ssl.SSLError if the client shows no
        certificate of this job)."""
        return self.server_context.wrap_socket(conn, server_side=True)

    def _context(self, protocol: int) -> ssl.SSLContext:
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_verify_locations(cadata=self.ca.decode())
        _load_chain(context, self.cert, self.key)
        return context


def _load_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """`load_cert_chain` reads files only: the PEM goes through a private temporary
    directory that is removed at once."""
    with tempfile.TemporaryDirectory() as directory:
        cert_path, key_path = Path(directory) / "cert", Path(directory) / "key"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)
