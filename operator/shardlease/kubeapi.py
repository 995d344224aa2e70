"""The Kubernetes API client: raw JSON over aiohttp, one error type.

Used by the Kubernetes store, the operator, the agent, the kubectl plugin and
the leader election. Every call answers `(HTTP status, decoded JSON body)`
and never raises for an HTTP status: the callers switch on the status (a 409
is a lost compare-and-swap, a 404 an absent object), and the server's own
message, which is what a user needs, stays in the body. A call that got no
answer at all (refused, reset, timed out, a TLS failure) raises `KubeAPIError`.

Why not kubernetes_asyncio: its typed models are slow to deserialize, and
its client package alone takes about a second and 45 MB to import, paid by
every agent (a sidecar in every pod) for models this package never uses.

Where the credentials come from, as client-go's clientcmd picks them
(`login`):

- inside a pod (KUBERNETES_SERVICE_HOST set) with no kubeconfig or context
  named: the pod's ServiceAccount. The token file is read again every minute,
  as client-go does, since the kubelet rotates projected tokens;
- else a kubeconfig: the one named, else every file of $KUBECONFIG (the first
  to set a name wins), else ~/.kube/config; the context named, else its
  current-context. Relative paths are relative to the file that holds them.
  A user may have a token, a tokenFile, a client certificate and key (files
  or data), a username and password, or an exec credential plugin
  (client.authentication.k8s.io, as `aws eks get-token` and
  `gke-gcloud-auth-plugin` are): it runs when a call needs credentials and
  again when they expire or the server answers 401.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardlease.errors import ConfigError, KubeAPIError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: How long a token read from a file is used before the file is read again.
TOKEN_FILE_TTL = 60.0
#: Exec credentials are renewed this long before they say they expire.
EXEC_MARGIN = 10.0
EXEC_TIMEOUT = 60.0


# -- the kubeconfig, as read (every field a kubeconfig may have that we use) --

class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class Cluster(_Model):
    server: str
    certificate_authority: str | None = Field(None, alias="certificate-authority")
    certificate_authority_data: str | None = Field(None, alias="certificate-authority-data")
    insecure_skip_tls_verify: bool = Field(False, alias="insecure-skip-tls-verify")
    tls_server_name: str | None = Field(None, alias="tls-server-name")


class ExecEnv(_Model):
    name: str
    value: str


class ExecConfig(_Model):
    command: str
    args: list[str] = []
    env: list[ExecEnv] | None = None
    api_version: str = Field("client.authentication.k8s.io/v1", alias="apiVersion")
    install_hint: str | None = Field(None, alias="installHint")


class User(_Model):
    token: str | None = None
    token_file: str | None = Field(None, alias="tokenFile")
    client_certificate: str | None = Field(None, alias="client-certificate")
    client_certificate_data: str | None = Field(None, alias="client-certificate-data")
    client_key: str | None = Field(None, alias="client-key")
    client_key_data: str | None = Field(None, alias="client-key-data")
    username: str | None = None
    password: str | None = None
    exec: ExecConfig | None = None
    auth_provider: dict[str, Any] | None = Field(None, alias="auth-provider")


class Context(_Model):
    cluster: str
    user: str = ""
    namespace: str | None = None


class _Named(_Model):
    name: str


class NamedCluster(_Named):
    cluster: Cluster


class NamedUser(_Named):
    user: User = Field(default_factory=lambda: User.model_validate({}))


class NamedContext(_Named):
    context: Context


class KubeconfigFile(_Model):
    clusters: list[NamedCluster] | None = None
    users: list[NamedUser] | None = None
    contexts: list[NamedContext] | None = None
    current_context: str | None = Field(None, alias="current-context")


class ExecStatus(_Model):
    token: str | None = None
    client_certificate_data: str | None = Field(None, alias="clientCertificateData")
    client_key_data: str | None = Field(None, alias="clientKeyData")
    expiration_timestamp: dt.datetime | None = Field(None, alias="expirationTimestamp")


class ExecCredential(_Model):
    status: ExecStatus


# -- what a client needs, resolved ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class Login:
    """Where the API server is and how to prove who we are."""

    server: str
    #: Where this came from, for messages: "in-cluster" or "kubeconfig PATH, context NAME".
    source: str
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: str | None = None  # PEM
    key_data: str | None = None  # PEM
    username: str | None = None
    password: str | None = None
    exec: ExecConfig | None = None
    #: The directory a relative exec command is found from (the kubeconfig's).
    exec_dir: str | None = None
    namespace: str | None = None


@dataclasses.dataclass(frozen=True)
class Credentials:
    """What a request carries at one moment (tokens and certificates change)."""

    headers: dict[str, str]
    cert_data: str | None = None
    key_data: str | None = None
    #: Monotonic time after which these must be fetched again (None: never).
    until: float | None = None
    #: Wall-clock expiry, for kopf's ConnectionInfo.
    expires: dt.datetime | None = None


def _pem(data: str, what: str, source: str) -> str:
    if data.lstrip().startswith("-----BEGIN "):
        return data
    try:
        pem = base64.b64decode("".join(data.split()), validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        pem = ""
    if not pem.lstrip().startswith("-----BEGIN "):
        raise ConfigError(f"{source}: {what} is neither PEM nor base64 PEM")
    return pem


def login(kubeconfig: str | None = None, context: str | None = None) -> Login:
    """The Login to use: the pod's ServiceAccount inside a cluster (unless a
    kubeconfig or a context is named), else the kubeconfig's context."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig and not context:
        return in_cluster()
    return from_kubeconfig(kubeconfig, context)


def in_cluster(root: Path | None = None) -> Login:
    root = root or SERVICE_ACCOUNT
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("in-cluster login: KUBERNETES_SERVICE_HOST is not set")
    if not (root / "token").is_file():
        raise ConfigError(f"in-cluster login: no ServiceAccount token at {root / 'token'} "
                          "(automountServiceAccountToken: false?)")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    namespace = None
    with contextlib.suppress(OSError):
        namespace = (root / "namespace").read_text().strip() or None
    ca = root / "ca.crt"
    return Login(server=f"https://{host}:{port}", source="in-cluster",
                 ca_file=str(ca) if ca.is_file() else None, token_file=str(root / "token"),
                 namespace=namespace)


def kubeconfig_paths(kubeconfig: str | None = None) -> list[Path]:
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG", "")
    paths = [Path(p).expanduser() for p in env.split(os.pathsep) if p.strip()]
    return paths or [Path("~/.kube/config").expanduser()]


def from_kubeconfig(kubeconfig: str | None = None, context: str | None = None) -> Login:
    import yaml  # kopf's dependency already; only a kubeconfig needs it

    current: str | None = None
    # name -> (the entry, the directory of the file that holds it)
    clusters: dict[str, tuple[Cluster, Path]] = {}
    users: dict[str, tuple[User, Path]] = {}
    contexts: dict[str, NamedContext] = {}
    paths = kubeconfig_paths(kubeconfig)
    read = []
    for path in paths:
        try:
            text = path.read_text()
        except FileNotFoundError:
            if kubeconfig or len(paths) == 1:
                raise ConfigError(f"no kubeconfig at {path} (and not inside a pod)") from None
            continue  # as kubectl: a missing file of $KUBECONFIG's list is skipped
        except OSError as e:
            raise ConfigError(f"kubeconfig {path} cannot be read: {e}") from None
        try:
            raw = yaml.safe_load(text) or {}
            if not isinstance(raw, dict):
                raise ConfigError(f"kubeconfig {path} is not a mapping")
            parsed = KubeconfigFile.model_validate(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"kubeconfig {path} is not YAML: {e}") from None
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"kubeconfig {path}: {where}: {first['msg']}") from None
        read.append(path)
        current = current or parsed.current_context
        for c in parsed.clusters or []:
            clusters.setdefault(c.name, (c.cluster, path.parent))
        for u in parsed.users or []:
            users.setdefault(u.name, (u.user, path.parent))
        for x in parsed.contexts or []:
            contexts.setdefault(x.name, x)
    where = ", ".join(map(str, read)) or ", ".join(map(str, paths))
    name = context or current
    if not name:
        raise ConfigError(f"kubeconfig {where}: no context named and no current-context")
    if name not in contexts:
        raise ConfigError(f"kubeconfig {where}: no context {name!r} "
                          f"(there are: {', '.join(sorted(contexts)) or 'none'})")
    ctx = contexts[name].context
    if ctx.cluster not in clusters:
        raise ConfigError(f"kubeconfig {where}: context {name!r} names cluster "
                          f"{ctx.cluster!r}, which it does not define")
    cluster, cdir = clusters[ctx.cluster]
    user, udir = users.get(ctx.user, (User.model_validate({}), cdir))
    source = f"kubeconfig {where}, context {name}"

    def rel(p: str | None, base: Path) -> str | None:
        return None if p is None else str(base / Path(p).expanduser())

    token = user.token
    if user.auth_provider is not None and not token:
        token = (user.auth_provider.get("config") or {}).get("access-token")
        if not token:
            raise ConfigError(
                f"{source}: auth-provider {user.auth_provider.get('name')!r} is not supported; "
                "use an exec credential plugin (client.authentication.k8s.io)")
    if not cluster.server.startswith(("https://", "http://")):
        raise ConfigError(f"{source}: cluster server {cluster.server!r} is not an http(s) URL")
    return Login(
        server=cluster.server.rstrip("/"), source=source,
        ca_file=rel(cluster.certificate_authority, cdir),
        ca_data=_pem(cluster.certificate_authority_data, "certificate-authority-data", source)
        if cluster.certificate_authority_data else None,
        insecure=cluster.insecure_skip_tls_verify, tls_server_name=cluster.tls_server_name,
        token=token, token_file=rel(user.token_file, udir),
        cert_file=rel(user.client_certificate, udir), key_file=rel(user.client_key, udir),
        cert_data=_pem(user.client_certificate_data, "client-certificate-data", source)
        if user.client_certificate_data else None,
        key_data=_pem(user.client_key_data, "client-key-data", source)
        if user.client_key_data else None,
        username=user.username, password=user.password, exec=user.exec,
        exec_dir=str(udir), namespace=ctx.namespace)


# -- credentials at the moment of a call ---------------------------------------

async def run_exec(config: ExecConfig, cwd: str | None, source: str) -> ExecStatus:
    """Run an exec credential plugin once (non-interactive) and read its answer."""
    command = config.command
    if os.sep in command and not os.path.isabs(command) and cwd:
        command = os.path.join(cwd, command)
    env = dict(os.environ)
    env.update({e.name: e.value for e in config.env or []})
    env["KUBERNETES_EXEC_INFO"] = json.dumps({
        "apiVersion": config.api_version, "kind": "ExecCredential",
        "spec": {"interactive": False}})
    hint = f" ({config.install_hint.strip()})" if config.install_hint else ""
    try:
        proc = await asyncio.create_subprocess_exec(
            command, *config.args, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise KubeAPIError(f"{source}: exec credential plugin {config.command!r} cannot "
                           f"run: {e}{hint}") from None
    try:
        async with asyncio.timeout(EXEC_TIMEOUT):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise KubeAPIError(f"{source}: exec credential plugin {config.command!r} did not "
                           f"answer within {EXEC_TIMEOUT:g}s") from None
    if proc.returncode != 0:
        raise KubeAPIError(f"{source}: exec credential plugin {config.command!r} exited "
                           f"{proc.returncode}: {err.decode(errors='replace').strip()[:500]}")
    try:
        return ExecCredential.model_validate_json(out).status
    except ValidationError as e:
        raise KubeAPIError(f"{source}: exec credential plugin {config.command!r} printed no "
                           f"ExecCredential with a status: {e.errors()[0]['msg']}") from None


async def credentials(login: Login) -> Credentials:
    """The headers and client certificate a request carries now."""
    if login.exec is not None:
        status = await run_exec(login.exec, login.exec_dir, login.source)
        headers = {"Authorization": f"Bearer {status.token}"} if status.token else {}
        until = expires = None
        if (stamp := status.expiration_timestamp) is not None:
            expires = stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)
            left = (expires - dt.datetime.now(dt.UTC)).total_seconds()
            until = time.monotonic() + max(0.0, left - EXEC_MARGIN)
        return Credentials(headers, cert_data=status.client_certificate_data,
                           key_data=status.client_key_data, until=until, expires=expires)
    if login.token_file is not None:
        return _token_file(login)
    if login.token:
        return Credentials({"Authorization": f"Bearer {login.token}"})
    if login.username is not None and login.password is not None:
        basic = aiohttp.BasicAuth(login.username, login.password).encode()
        return Credentials({"Authorization": basic})
    return Credentials({})


def _token_file(login: Login) -> Credentials:
    # A blocking read in the event loop, on purpose: a token of a few hundred
    # bytes on the kubelet's tmpfs, once a minute.
    assert login.token_file is not None
    try:
        token = Path(login.token_file).read_text().strip()
    except OSError as e:
        raise KubeAPIError(f"{login.source}: token file cannot be read: {e}") from None
    return Credentials({"Authorization": f"Bearer {token}"},
                       until=time.monotonic() + TOKEN_FILE_TTL)


def ssl_context(login: Login, creds: Credentials) -> ssl.SSLContext | bool:
    """The TLS context for the server (False: plain http)."""
    if login.server.startswith("http://"):
        return False
    ctx = ssl.create_default_context(cafile=login.ca_file, cadata=login.ca_data)
    if login.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert = creds.cert_data or login.cert_data
    key = creds.key_data or login.key_data
    try:
        if cert or key:
            # Python's ssl loads a certificate chain from files only: written
            # to a private directory for the moment it takes, as kopf does.
            with tempfile.TemporaryDirectory(prefix="shardlease-tls-") as tmp:
                cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
                cert_path.write_text(cert or "")
                key_path.write_text(key or "")
                ctx.load_cert_chain(cert_path, key_path)
        elif login.cert_file:
            ctx.load_cert_chain(login.cert_file, login.key_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{login.source}: the client certificate cannot be loaded: {e}") \
            from None
    return ctx


#: What asyncio reads of a TLS connection at a time (`small_tls_reads`).
TLS_READ_SIZE = 32 * 1024


def small_tls_reads(size: int = TLS_READ_SIZE) -> None:
    """Make asyncio read TLS connections `size` bytes at a time, for the
    whole process. asyncio zero-fills a read buffer of 256 KiB per TLS
    connection for the connection's life, and an agent holds about 36 to the
    API server (32 lease writes at once, the watches, kopf's): 9 MB of a
    sidecar that is meant to stay under 60 MB. 32 KiB still takes in a whole
    TLS record (at most 16 KiB and its overhead) per read, and OpenSSL
    decrypts one record per read whatever the buffer."""
    asyncio.sslproto.SSLProtocol.max_size = size


# -- the client ------------------------------------------------------------------

class KubeClient:
    """One connection pool to one API server. Opened lazily inside the
    running event loop; `close()` when done."""

    def __init__(self, login: Login) -> None:
        self.login = login
        self._session: aiohttp.ClientSession | None = None
        self._creds: Credentials | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, kubeconfig: str | None = None,
                    context: str | None = None) -> KubeClient:
        return cls(login(kubeconfig, context))

    @property
    def namespace(self) -> str | None:
        return self.login.namespace

    async def credentials(self, renew: bool = False) -> Credentials:
        async with self._lock:
            creds = self._creds
            if renew or creds is None or (creds.until is not None
                                          and time.monotonic() >= creds.until):
                fresh = await credentials(self.login)
                certs_changed = creds is None or (creds.cert_data, creds.key_data) != (
                    fresh.cert_data, fresh.key_data)
                if certs_changed and self._session is not None:
                    await self._session.close()
                    self._session = None
                self._creds = creds = fresh
            if self._session is None:
                ctx = ssl_context(self.login, creds)
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=ctx),
                    headers={"Accept": "application/json"})
            return creds

    async def _send(self, method: str, path: str, *, query: list[tuple[str, str]] | None,
                    body: Any, content_type: str,
                    limits: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        if isinstance(body, (dict, list)):
            data: bytes | None = json.dumps(body).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = body
        for attempt in (1, 2):
            creds = await self.credentials(renew=attempt == 2)
            assert self._session is not None
            headers = dict(creds.headers)
            if data is not None:
                headers["Content-Type"] = content_type
            try:
                resp = await self._session.request(
                    method, self.login.server + path, params=query or None, data=data,
                    headers=headers, timeout=limits,
                    server_hostname=self.login.tls_server_name)
            except (aiohttp.ClientError, OSError, TimeoutError, ssl.SSLError) as e:
                raise KubeAPIError(f"{method} {path}: no answer from {self.login.server}: "
                                   f"{e!r}") from None
            # A 401 with credentials that change (rotated token, exec plugin)
            # is tried once more with fresh ones: the request was not executed.
            if resp.status == 401 and attempt == 1 and (self.login.exec or self.login.token_file):
                resp.release()
                continue
            return resp
        raise AssertionError("unreachable")

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json", request_timeout: float = 15.0,
                   query: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any]]:
        """One request: (HTTP status, decoded JSON body); never raises for a status."""
        resp = await self._send(method, path, query=query, body=body,
                                content_type=content_type,
                                limits=aiohttp.ClientTimeout(total=request_timeout))
        try:
            data = await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise KubeAPIError(f"{method} {path}: the answer was cut off: {e!r}") from None
        finally:
            resp.release()
        try:
            payload = json.loads(data) if data else {}
        except ValueError:
            payload = {"message": data[:300].decode(errors="replace")}
        if not isinstance(payload, dict):
            payload = {"message": str(payload)[:300]}
        return resp.status, payload

    @contextlib.asynccontextmanager
    async def stream(self, path: str, query: list[tuple[str, str]] | None,
                     limits: aiohttp.ClientTimeout) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it comes (a watch); closed on exit."""
        resp = await self._send("GET", path, query=query, body=None,
                                content_type="application/json", limits=limits)
        try:
            yield resp
        finally:
            resp.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
