"""A fault-injecting HTTP proxy for S3: a slow or throttling store, on demand.

`FaultProxy` listens on loopback and forwards every request to a real S3
endpoint (MinIO, moto) unchanged: the same method, raw path and query,
headers and body, the Host header included, so SigV4 signatures made for the
proxy's address still verify upstream. The answer comes back unchanged too.
Point one node's store URL at the proxy (``?endpoint=http://127.0.0.1:PORT``)
and its peers at the server itself: the faults hit that node only.

Faults (`Faults`), changeable at run time with `set()`:

- `latency`: seconds added to each request before it is forwarded (requests
  wait side by side, not in a queue);
- `error_rate`: the share of requests answered ``503 SlowDown`` (after the
  latency) without being forwarded, as S3 answers when throttling;
- `kinds`: the kinds of request the faults apply to (default: every one);
- `keys`: the objects they apply to, as the ends of their paths (``leases/7``:
  one shard's lease, a hot key of the store; default: every path).

Kinds, as `counts()` reports them: ``list``, ``get``, ``head``, ``put-lease``
(claims, renewals, frees), ``put-heartbeat``, ``put`` (anything else),
``delete``, ``other``; plus ``slowdown``, the 503 answers injected, and
``abandoned``, requests whose client hung up before the answer. A request the
client abandoned is still forwarded (as S3 may carry out a request whose
answer nobody reads).

Used by `shardlease bench` (in its own event loop) and by the tests
(`ProxyThread`: the proxy in a thread of its own, controlled from sync code).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from multidict import CIMultiDict
from yarl import URL

#: Headers that belong to one HTTP hop, never forwarded (either way).
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                  "te", "trailer", "trailers", "transfer-encoding", "upgrade", "expect",
                  "content-length"})

#: Headers aiohttp's client would add to a forwarded request: none is added
#: (an Accept-Encoding the client never sent let the server compress an
#: answer that the client, SlateDB's object_store, then read as it came).
_NO_AUTO_HEADERS = ("Content-Type", "Accept-Encoding", "Accept", "User-Agent")

KINDS = ("list", "get", "head", "put-lease", "put-heartbeat", "put", "delete", "other")

_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


@dataclass(frozen=True)
class Faults:
    latency: float = 0.0
    error_rate: float = 0.0
    #: The kinds of request hit (see `KINDS`); None: every request.
    kinds: frozenset[str] | None = None
    #: The objects hit, by the end of their path after a "/" (``leases/7``);
    #: None: every path.
    keys: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.latency < 0 or not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"bad faults: {self}")
        if self.keys is not None and any(not k or k.startswith("/") for k in self.keys):
            raise ValueError(f"bad keys (each the end of a path, without a leading /): "
                             f"{sorted(self.keys)}")

    def hits(self, kind: str, path: str = "") -> bool:
        return (self.kinds is None or kind in self.kinds) and (
            self.keys is None or any(path.endswith("/" + k) for k in self.keys))

    def describe(self) -> str:
        parts = []
        if self.latency:
            parts.append(f"+{self.latency:g}s")
        if self.error_rate:
            parts.append(f"{self.error_rate:.0%} 503 SlowDown")
        if self.kinds is not None:
            parts.append("on " + ", ".join(sorted(self.kinds)))
        if self.keys is not None:
            parts.append("of " + ", ".join(sorted(self.keys)))
        return " ".join(parts) or "no fault"


NO_FAULTS = Faults()


@dataclass(frozen=True)
class Seen:
    """One request the proxy handled (wall times), for diagnosis."""

    arrived: float
    answered: float
    kind: str
    path: str
    #: The answer's status (503: injected SlowDown; 0: the forward failed).
    status: int
    abandoned: bool


def request_kind(method: str, path: str, query: str) -> str:
    """What an S3 request does, from its method and path (path-style URLs)."""
    if method == "GET":
        return "list" if "list-type=" in query or path.count("/") <= 1 else "get"
    if method == "HEAD":
        return "head"
    if method == "PUT":
        if "/leases/" in path:
            return "put-lease"
        if "/heartbeats/" in path:
            return "put-heartbeat"
        return "put"
    if method == "DELETE":
        return "delete"
    return "other"


class FaultProxy:
    """The proxy, in the running event loop: `await start()`, `await aclose()`."""

    def __init__(self, upstream: str, *, seed: int | None = None,
                 host: str = "127.0.0.1") -> None:
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.faults = NO_FAULTS
        self.rng = random.Random(seed)
        self._counts: Counter[str] = Counter()
        #: Every request handled, in the order answered (`Seen`).
        self.history: list[Seen] = []
        self._lock = threading.Lock()  # counts() may be read from another thread
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def set(self, faults: Faults) -> None:
        """Apply `faults` to the requests that arrive from now on."""
        self.faults = faults

    def counts(self) -> Counter[str]:
        """Requests seen so far, by kind (and ``slowdown``, ``abandoned``)."""
        with self._lock:
            return Counter(self._counts)

    def _count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    async def start(self) -> str:
        """Listen on a free port of `host`; returns the endpoint URL."""
        self._session = ClientSession(
            connector=TCPConnector(limit=0), auto_decompress=False,
            timeout=ClientTimeout(total=None, sock_connect=10, sock_read=60))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self.endpoint

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        arrived = time.time()
        body = await request.read()
        kind = request_kind(request.method, request.path, request.query_string)
        self._count(kind)
        faults = self.faults
        status = 0
        length: str | None = None
        try:
            if faults.hits(kind, request.path):
                if faults.latency:
                    await asyncio.sleep(faults.latency)
                if faults.error_rate and self.rng.random() < faults.error_rate:
                    self._count("slowdown")
                    status = 503
                    return web.Response(status=503, body=_SLOWDOWN,
                                        content_type="application/xml")
            headers = CIMultiDict((k, v) for k, v in request.headers.items()
                                  if k.lower() not in _HOP)
            url = URL(self.upstream + request.raw_path, encoded=True)
            async with self._session.request(request.method, url, headers=headers,
                                             data=body or None, allow_redirects=False,
                                             skip_auto_headers=_NO_AUTO_HEADERS) as answer:
                data = await answer.read()
                out = CIMultiDict((k, v) for k, v in answer.headers.items()
                                  if k.lower() not in _HOP)
                status = answer.status
                if request.method == "HEAD" and "Content-Length" in answer.headers:
                    # A HEAD's answer has no body, but its Content-Length is
                    # the object's size (SlateDB's object_store reads it).
                    length = answer.headers["Content-Length"]
        finally:
            abandoned = request.transport is None or request.transport.is_closing()
            if abandoned:
                self._count("abandoned")
            with self._lock:
                self.history.append(Seen(arrived, time.time(), kind, request.path, status,
                                         abandoned))
        if length is not None:
            head = web.StreamResponse(status=status, headers=out)
            head.content_length = int(length)
            with contextlib.suppress(ConnectionError):  # its client hung up
                await head.prepare(request)
                await head.write_eof()
            return head
        return web.Response(status=status, body=data, headers=out)


class ProxyThread:
    """A `FaultProxy` in a daemon thread with its own event loop, for sync
    callers (the process tests): ``with ProxyThread(upstream) as proxy:``."""

    def __init__(self, upstream: str, *, seed: int | None = None) -> None:
        self.proxy = FaultProxy(upstream, seed=seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    def set(self, faults: Faults) -> None:
        self.proxy.set(faults)

    def counts(self) -> Counter[str]:
        return self.proxy.counts()

    def history(self) -> list[Seen]:
        with self.proxy._lock:
            return list(self.proxy.history)

    def _main(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.proxy.start()
            except BaseException as e:
                self._error = e
                raise
            finally:
                self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await self.proxy.aclose()

        asyncio.run(serve())

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None or not self.proxy.port:
            raise RuntimeError(f"the fault proxy did not start: {self._error}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@contextmanager
def proxy_thread(upstream: str, *, seed: int | None = None) -> Iterator[ProxyThread]:
    with ProxyThread(upstream, seed=seed) as proxy:
        yield proxy
