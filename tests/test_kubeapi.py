"""shardlease.kubeapi: how a kubeconfig or a pod's ServiceAccount becomes a
Login (tables of files), exec credential plugins run for real, and the client
against a real HTTP server on loopback (a token rotated under it, a server
that is not there, an answer that is not JSON)."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shardlease import kubeapi
from shardlease.errors import ConfigError, KubeAPIError
from shardlease.k8s.login import connection_info

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
B64 = base64.b64encode(PEM.encode()).decode()


def config(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c1", "cluster": {"server": "https://one:6443/",
                                                "certificate-authority": "ca.pem"}},
                     {"name": "c2", "cluster": {"server": "https://two",
                                                "certificate-authority-data": B64,
                                                "tls-server-name": "kubernetes"}}],
        "users": [{"name": "u1", "user": {"token": "tok"}},
                  {"name": "u2", "user": {"client-certificate-data": B64,
                                          "client-key-data": B64}},
                  {"name": "u3", "user": {"tokenFile": "../t/token"}},
                  {"name": "u4", "user": {"username": "ann", "password": "pw"}},
                  {"name": "u5", "user": {"auth-provider": {"name": "gcp"}}},
                  {"name": "u6", "user": {"auth-provider": {"name": "oidc", "config": {
                      "access-token": "from-provider"}}}}],
        "contexts": [{"name": "a", "context": {"cluster": "c1", "user": "u1"}},
                     {"name": "b", "context": {"cluster": "c2", "user": "u2",
                                               "namespace": "team"}},
                     {"name": "c", "context": {"cluster": "c1", "user": "u3"}},
                     {"name": "d", "context": {"cluster": "c1", "user": "u4"}},
                     {"name": "gone", "context": {"cluster": "nowhere", "user": "u1"}},
                     {"name": "gcp", "context": {"cluster": "c1", "user": "u5"}},
                     {"name": "oidc", "context": {"cluster": "c1", "user": "u6"}},
                     {"name": "anon", "context": {"cluster": "c1"}}],
    }
    doc.update(over)
    return doc


def write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def cfgdir(tmp_path: Path) -> Path:
    return tmp_path / "kube"


@pytest.mark.parametrize(("context", "expect"), [
    (None, dict(server="https://one:6443", token="tok", namespace=None, ca_file="kube/ca.pem")),
    ("b", dict(server="https://two", ca_data=PEM, cert_data=PEM, key_data=PEM,
               tls_server_name="kubernetes", namespace="team", token=None)),
    ("c", dict(token_file="t/token", token=None)),
    ("d", dict(username="ann", password="pw")),
    ("oidc", dict(token="from-provider")),
    ("anon", dict(token=None, cert_data=None, username=None)),
])
def test_a_kubeconfig_context_becomes_a_login(tmp_path: Path, cfgdir: Path,
                                              context: str | None,
                                              expect: dict[str, Any]) -> None:
    path = write(cfgdir / "config", config())
    got = kubeapi.from_kubeconfig(str(path), context)
    for field, value in expect.items():
        actual = getattr(got, field)
        if field.endswith("_file") and value is not None:
            # relative to the file that holds it
            assert Path(actual).resolve() == (tmp_path / value).resolve(), field
        else:
            assert actual == value, field
    assert str(path) in got.source


@pytest.mark.parametrize(("doc", "context", "message"), [
    (config(), "nope", "no context 'nope' (there are: a, anon, b"),
    (config(), "gone", "names cluster 'nowhere', which it does not define"),
    (config(), "gcp", "auth-provider 'gcp' is not supported; use an exec"),
    (config(**{"current-context": None}), None, "no context named and no current-context"),
    (config(clusters=[{"name": "c1", "cluster": {"server": "one:6443"}}]), None,
     "is not an http(s) URL"),
    (config(clusters=[{"name": "c1", "cluster": {}}]), None, "clusters.0.cluster.server"),
    (config(users=[{"name": "u1", "user": {"client-key-data": "%%%"}}]), None,
     "client-key-data is neither PEM nor base64 PEM"),
    ("clusters: [unclosed", None, "is not YAML"),
    ("- a list", None, "is not a mapping"),
])
def test_a_kubeconfig_that_cannot_work_says_why(cfgdir: Path, doc: Any, context: str | None,
                                                message: str) -> None:
    path = write(cfgdir / "config", doc)
    with pytest.raises(ConfigError) as err:
        kubeapi.from_kubeconfig(str(path), context)
    assert message in str(err.value)


def test_kubeconfig_files_merge_the_first_to_name_a_thing_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(tmp_path / "one", {"current-context": "x", "users": [
        {"name": "u1", "user": {"token": "first"}}]})
    second = write(tmp_path / "two", config(**{"current-context": "b"}))
    missing = tmp_path / "absent"
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(map(str, (first, missing, second))))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="no context 'x'"):
        kubeapi.login()
    got = kubeapi.login(context="a")
    assert got.token == "first" and got.server == "https://one:6443"
    assert kubeapi.login(context="b").namespace == "team"
    assert kubeapi.login(context="a").namespace is None  # (kubectl's "default")


def test_a_named_kubeconfig_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no kubeconfig at"):
        kubeapi.login(str(tmp_path / "absent"))


def test_inside_a_pod_the_service_account_unless_a_kubeconfig_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    write(sa / "token", "sa-token\n")
    write(sa / "namespace", "apps")
    write(sa / "ca.crt", PEM)
    monkeypatch.setattr(kubeapi, "SERVICE_ACCOUNT", sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    got = kubeapi.login()
    assert (got.server, got.namespace, got.token_file, got.ca_file, got.source) == (
        "https://[fd00::1]:443", "apps", str(sa / "token"), str(sa / "ca.crt"), "in-cluster")
    named = write(tmp_path / "kc", config())
    assert kubeapi.login(str(named)).token == "tok"
    (sa / "token").unlink()
    with pytest.raises(ConfigError, match="automountServiceAccountToken"):
        kubeapi.login()


def plugin(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bin" / "cred-plugin"
    write(path, f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


async def test_an_exec_plugin_is_run_with_its_env_and_its_answer_used(tmp_path: Path) -> None:
    plugin(tmp_path, """
        import json, os, sys
        info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
        assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False
        print(json.dumps({"kind": "ExecCredential", "status": {
            "token": os.environ["GIVE"] + ":" + sys.argv[1],
            "expirationTimestamp": "2099-01-01T00:00:00Z"}}))
    """)
    path = write(tmp_path / "config", config(users=[{"name": "u1", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/cred-plugin",
        "args": ["arg"], "env": [{"name": "GIVE", "value": "secret"}]}}}]))
    login = kubeapi.from_kubeconfig(str(path))
    creds = await kubeapi.credentials(login)
    assert creds.headers == {"Authorization": "Bearer secret:arg"}
    assert creds.expires is not None and creds.expires.year == 2099
    assert creds.until is not None
    info = await connection_info(login)
    assert (info.scheme, info.token, info.server) == ("Bearer", "secret:arg", "https://one:6443")


@pytest.mark.parametrize(("body", "message"), [
    ("import sys; print('denied', file=sys.stderr); sys.exit(3)", "exited 3: denied"),
    ("print('not json')", "printed no ExecCredential"),
])
async def test_an_exec_plugin_that_fails_says_how(tmp_path: Path, body: str,
                                                  message: str) -> None:
    plugin(tmp_path, body)
    path = write(tmp_path / "config", config(users=[{"name": "u1", "user": {"exec": {
        "command": "./bin/cred-plugin", "installHint": "install cred-plugin"}}}]))
    with pytest.raises(KubeAPIError, match=message):
        await kubeapi.credentials(kubeapi.from_kubeconfig(str(path)))


async def test_an_exec_plugin_that_is_not_there_gives_the_install_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "config", config(users=[{"name": "u1", "user": {"exec": {
        "command": "no-such-plugin-anywhere", "installHint": "brew install it"}}}]))
    with pytest.raises(KubeAPIError, match=r"cannot run: .*brew install it"):
        await kubeapi.credentials(kubeapi.from_kubeconfig(str(path)))


async def serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_a_rotated_token_file_is_read_again_on_a_401(tmp_path: Path) -> None:
    token = write(tmp_path / "token", "old")
    seen: list[tuple[str, str, str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        seen.append((request.method, request.path_qs, auth, await request.text()))
        if auth != "Bearer new":
            return web.json_response({"message": "Unauthorized"}, status=401)
        return web.json_response({"kind": "Lease", "ok": True}, status=201)

    runner, url = await serve(handler)
    client = kubeapi.KubeClient(kubeapi.Login(server=url, source="test",
                                              token_file=str(token)))
    try:
        code, body = await client.call("GET", "/api")
        assert (code, body["message"]) == (401, "Unauthorized")  # tried twice, the same token
        token.write_text("new\n")
        code, body = await client.call("POST", "/leases", {"spec": {}},
                                       query=[("dryRun", "All")])
        assert (code, body["ok"]) == (201, True)
    finally:
        await client.close()
        await runner.cleanup()
    assert [s[2] for s in seen] == ["Bearer old", "Bearer old", "Bearer old", "Bearer new"]
    assert seen[-1][:2] == ("POST", "/leases?dryRun=All")
    assert json.loads(seen[-1][3]) == {"spec": {}}


async def test_an_answer_that_is_not_json_keeps_its_text(tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="<html>bad gateway</html>", status=502)

    runner, url = await serve(handler)
    client = kubeapi.KubeClient(kubeapi.Login(server=url, source="test", token="t"))
    try:
        assert await client.call("GET", "/version") == (
            502, {"message": "<html>bad gateway</html>"})
        async with client.stream("/watch", [("watch", "1")],
                                 kubeapi.aiohttp.ClientTimeout(total=5)) as resp:
            assert resp.status == 502
    finally:
        await client.close()
        await runner.cleanup()


async def test_no_server_is_a_kube_api_error_naming_the_server() -> None:
    client = kubeapi.KubeClient(kubeapi.Login(server="http://127.0.0.1:9", source="test"))
    try:
        with pytest.raises(KubeAPIError, match=r"GET /version: no answer from http://127\.0\.0"):
            await client.call("GET", "/version", request_timeout=5)
    finally:
        await client.close()


@pytest.fixture
def tls_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    import subprocess

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


async def test_small_tls_reads_keep_each_connection_small_and_every_answer_whole(
        tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's reads of 32 KiB (not asyncio's 256 KiB buffer per TLS
    connection) still bring an answer many times that size back intact."""
    import asyncio.sslproto
    import ssl

    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size",
                        asyncio.sslproto.SSLProtocol.max_size)  # restored after the test
    kubeapi.small_tls_reads()
    assert asyncio.sslproto.SSLProtocol.max_size == kubeapi.TLS_READ_SIZE == 32 * 1024
    cert, key = tls_cert
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    items = [{"name": f"lease-{i}", "holder": "x" * 200} for i in range(5000)]  # ~1.1 MB

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"items": items})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = kubeapi.KubeClient(kubeapi.Login(server=f"https://127.0.0.1:{port}",
                                              source="test", ca_file=str(cert), token="t"))
    try:
        assert await client.call("GET", "/leases") == (200, {"items": items})
        buffers = [len(t._ssl_protocol._ssl_buffer) for t in _tls_transports(client)]
        assert buffers == [32 * 1024]
    finally:
        await client.close()
        await runner.cleanup()


def _tls_transports(client: kubeapi.KubeClient) -> list[Any]:
    """The TLS transports of the client's pooled connections."""
    assert client._session is not None
    pooled = client._session.connector._conns.values()  # type: ignore[union-attr]
    return [proto.transport for conns in pooled for proto, _ in conns
            if proto.transport is not None]
