"""S3 servers for the tests, on loopback, started by the tests themselves.

Two kinds: moto's S3 server, run in a child process on a free
port, and a real MinIO process (the `minio` fixture). Child processes reach
either over HTTP like any S3 endpoint, so they serve process tests too.

Use from a test module (or a conftest) with::

    pytest_plugins = ["tests.support.s3server"]

- `s3_server` (session): the running `S3Server`; while it lives, the AWS
  credential and region variables are set in `os.environ` (and so passed to
  child processes), and AWS config files and instance metadata are turned off.
- `s3_endpoint` (session): its endpoint URL, ``http://127.0.0.1:PORT``.
- `s3_bucket` (function): a fresh, empty bucket per test.

`S3Server.env()` gives the variables a child process needs, endpoint included.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import boto3
import pytest

ACCESS_KEY = "shardlease-test"
SECRET_KEY = "shardlease-test-secret"
REGION = "us-east-1"


@dataclass(frozen=True, kw_only=True)
class S3Server:
    kind: str
    endpoint: str
    region: str = REGION
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY

    def env(self) -> dict[str, str]:
        """Variables for a process that should use this server by default."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def client(self) -> Any:
        """A plain (synchronous) boto3 client, for setting things up."""
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key)

    def create_bucket(self, name: str | None = None) -> str:
        bucket = name or f"t-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def url(self, bucket: str, prefix: str = "") -> str:
        """An s3:// store URL on this server."""
        path = f"/{prefix}" if prefix else ""
        return f"s3://{bucket}{path}?endpoint={self.endpoint}&path_style=true"


@contextmanager
def moto_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, in a child process (see
    tests/support/motoserve.py for why not a thread)."""
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("motoserve.py"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            pytest.fail(f"moto's S3 server did not start (exit {proc.poll()}): {line!r}",
                        pytrace=False)
        yield S3Server(kind="moto", endpoint=f"http://127.0.0.1:{int(line)}")
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def minio_server(host: str = "127.0.0.1") -> Iterator[S3Server]:
    """A real MinIO server (built from its Go module by e2e/controlplane and
    cached) on a free port of `host` (loopback, or the test node's address)
    with a throw-away data directory."""
    import socket
    import subprocess
    import tempfile
    import time
    import urllib.request

    from tests.k8s.fixtures import cpmod

    try:
        binary = cpmod.ensure_binaries(("minio",))["minio"]
    except cpmod.BuildError as e:
        pytest.fail(f"cannot build minio (e2e/controlplane build minio):\n{e}", pytrace=False)
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="shardlease-minio-") as data:
        env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "HOME": data}
        log = open(os.path.join(data, "minio.log"), "wb")
        proc = subprocess.Popen(
            [str(binary), "server", os.path.join(data, "d"), "--address", f"{host}:{port}",
             "--quiet"], stdout=log, stderr=subprocess.STDOUT, env=env)
        endpoint = f"http://{host}:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{endpoint}/minio/health/ready", timeout=2):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.flush()
                        tail = open(os.path.join(data, "minio.log"), "rb").read()[-2000:]
                        pytest.fail(f"MinIO did not become ready:\n{tail.decode(errors='replace')}",
                                    pytrace=False)
                    time.sleep(0.2)
            yield S3Server(kind="minio", endpoint=endpoint)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.close()


#: Server kinds by name: a context manager that starts one and yields it.
KINDS: dict[str, Callable[[], AbstractContextManager[S3Server]]] = {
    "moto": moto_server, "minio": minio_server}


@contextmanager
def aws_environment(server: S3Server) -> Iterator[None]:
    """Point the AWS credential chain at the test server's credentials (not
    its endpoint: the tests pass it explicitly), and restore afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.env().items():
            if name != "AWS_ENDPOINT_URL_S3":
                patch.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                     "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with KINDS["moto"]() as server, aws_environment(server):
        yield server


@pytest.fixture(scope="session")
def minio() -> Iterator[S3Server]:
    """A MinIO server for the session (the S3 suite runs on it as on moto)."""
    with KINDS["minio"]() as server, aws_environment(server):
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: S3Server) -> str:
    return s3_server.endpoint


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    return s3_server.create_bucket()


class NotS3(BaseHTTPRequestHandler):
    """A web server that answers every request with 200 and a page."""

    page: ClassVar[bytes] = b"<!DOCTYPE html>\n<html><body>It works!</body></html>"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    do_GET = do_PUT = do_DELETE = do_HEAD = answer


@pytest.fixture
def not_s3() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotS3)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
