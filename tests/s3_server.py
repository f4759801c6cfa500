"""A real S3-compatible server on loopback for the remote-data tests (moto in server mode).

It enforces credentials: at start it creates an IAM user with read/write access and
that user's key, then switches authentication on, so a request signed with any other
key is refused the way S3 refuses it. One server serves the whole test session
(the `s3_server` fixture in tests/conftest.py); each test writes under its own prefix.
"""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

BUCKET = "training-data"
REGION = "us-east-1"


class S3Server:
    """A running moto server, its valid key, and helpers to write objects and point env at it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.key_id, self.secret = self._create_reader_key()
        self._post("/moto-api/reset-auth", b"0")  # from now on every request is checked
        self._client().create_bucket(Bucket=BUCKET)

    def stop(self) -> None:
        self._server.stop()

    def use(self, monkeypatch: pytest.MonkeyPatch, key_id: str = "", secret: str = "") -> None:
        """Point this process's environment (and so the jobs it launches) at the server,
        with the valid key unless another is given."""
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id or self.key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret or self.secret)
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.endpoint)
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(name, raising=False)
        # No ~/.aws of whoever runs the tests.
        monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")

    def new_prefix(self) -> str:
        """A fresh s3:// prefix in the bucket, for one test's objects."""
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def put(self, url: str, data: bytes) -> str:
        """Write `data` to the object at `url` (s3://bucket/key); returns `url`."""
        bucket, _, key = url.removeprefix("s3://").partition("/")
        self._client().put_object(Bucket=bucket, Key=key, Body=data)
        return url

    def _client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )

    def _create_reader_key(self) -> tuple[str, str]:
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="trainer")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def _post(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(
            self.endpoint + path,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
