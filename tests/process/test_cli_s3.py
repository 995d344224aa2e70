"""The command line against S3: an unusable S3 store is one clear line and
exit status 1, never a traceback; `owners` reads S3 like any store."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.support.s3server import S3Server

pytestmark = pytest.mark.slow

# The fixtures s3_server (MinIO over HTTP on loopback, session-wide: conftest.py).
pytest_plugins = ["tests.support.s3server"]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
               "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def shardlease(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardlease", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, **env})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_store_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1, result.stderr  # nothing else: no warning, no traceback
    for word in words:
        assert word in errors[0], errors[0]


def test_a_node_on_an_unreachable_s3_endpoint_exits_1_with_a_clear_message() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    url = f"s3://leases/sl?endpoint={endpoint}&path_style=true"
    result = shardlease("node", "--store", url, "--cluster", "c", "--name", "a",
                        "--shards", "4", env=CREDENTIALS)
    assert_store_error(result, "127.0.0.1")


def test_owners_on_an_unreachable_s3_endpoint_exits_1_with_a_clear_message() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    url = f"s3://leases/sl?endpoint={endpoint}&path_style=true"
    result = shardlease("owners", "--store", url, "--cluster", "c", "-o", "json",
                        env=CREDENTIALS)
    assert_store_error(result, "127.0.0.1")
    assert result.stdout == ""


def test_a_node_on_a_missing_bucket_exits_1(s3_server: S3Server) -> None:
    url = s3_server.url("no-such-bucket-here", "sl")
    result = shardlease("node", "--store", url, "--cluster", "c", "--name", "a",
                        "--shards", "4", env=s3_server.env())
    assert_store_error(result, "no-such-bucket-here")


def test_a_bad_s3_url_is_a_config_error() -> None:
    result = shardlease("node", "--store", "s3://leases/sl?colour=blue", "--cluster", "c",
                        "--name", "a", "--shards", "4", env=CREDENTIALS)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "colour" in result.stderr


def test_owners_reads_s3(s3_server: S3Server) -> None:
    url = s3_server.url(s3_server.create_bucket(), "sl")
    result = shardlease("owners", "--store", url, "--cluster", "c", "--shards", "3",
                        "-o", "json", env=s3_server.env())
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["shards"] == [
        {"shard": s, "owner": None, "generation": 0, "since": None, "heartbeat": None,
         "renewal": None} for s in range(3)]


@pytest.mark.parametrize("command", ["node", "owners"])
def test_an_endpoint_that_is_not_s3_is_named_as_such_not_as_an_http_500(
        not_s3: str, command: str) -> None:
    url = f"s3://leases/sl?endpoint={not_s3}&path_style=true"
    args = ["--name", "a", "--shards", "4"] if command == "node" else []
    result = shardlease(command, "--store", url, "--cluster", "c", *args, env=CREDENTIALS)
    assert_store_error(result, "does not look like S3", "HTTP 200", "text/html", not_s3)
    assert "500" not in result.stderr
