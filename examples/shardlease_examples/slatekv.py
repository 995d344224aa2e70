"""A sharded key-value service whose every shard is a SlateDB database.

Run it beside a shardlease agent (or ``shardlease node --host http://...``)::

    python -m shardlease_examples.slatekv --port 8080 --shards 16 \\
        --store 's3://bucket/prefix?endpoint=http://127.0.0.1:9000&path_style=true'

Shard n is the database ``<prefix>/shard-<n>``. The fencing (the generation
guard, the open / re-check / reopen, durable writes, reads bounded by the
validity) is `shardlease_examples.slatefence`'s; this module is the
application's own API on top of it (docs/slatedb.md)::

    PUT  /kv/{key}    the body (UTF-8) becomes the value, answered once durable
    GET  /kv/{key}    {"key", "value", "generation": of the owner that stored it,
                       "shard", "served_by": the generation open here}, or 404
    POST /cas/{key}   {"expected": V or null, "value": W}: W if the value is V
                      (null: the key has none); {"swapped", "value", "generation"}
    GET  /shards      the shards open here and their generations
    GET  /healthz

and the host protocol (docs/host-api.yaml). A key belongs to shard
``shardlease.routing.shard_for_key(key, shards)``; a request for a shard not
open here (or past its validity) is answered 421, with a hint to ask the
agent's ``/lookup``. A failed write says ``"applied": "unknown"`` when it
may have landed: the client must not count it as refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any, TextIO
from urllib.parse import quote

from aiohttp import web

from shardlease.errors import ConfigError
from shardlease.routing import shard_for_key
from shardlease_examples.slatefence import (
    BadRequest,
    Bucket,
    NotOpen,
    SlateShards,
    Stored,
    default_settings,
    errors_middleware,
    host_routes,
    json_body,
    lifetime,
)

log = logging.getLogger("shardlease_examples.slatekv")

MAX_KEY_CHARS = 512
MAX_VALUE_BYTES = 64 * 1024
KEY_LOCKS = 256


class KV:
    """The key-value API over the shards of one process."""

    def __init__(self, shards: SlateShards, agent_url: str | None = None) -> None:
        self.shards = shards
        self.agent_url = agent_url
        # A cas reads, compares and writes: writes of a key go one at a time
        # (striped locks: bounded memory), so nothing of this process lands
        # between its read and its write, and no other process writes the
        # shard (SlateDB fences it).
        self._key_locks = [asyncio.Lock() for _ in range(KEY_LOCKS)]

    def _shard(self, key: str) -> int:
        return shard_for_key(key, self.shards.shards)

    def _misdirected(self, e: NotOpen, key: str) -> NotOpen:
        if self.agent_url:
            e.details["lookup"] = f"{self.agent_url}/lookup?key={quote(key, safe='')}"
        e.details["key"] = key
        return e

    def _locked(self, key: str) -> asyncio.Lock:
        return self._key_locks[hash(key) % KEY_LOCKS]

    async def put(self, key: str, value: str) -> int:
        async with self._locked(key):
            return await self.shards.put(self._shard(key), key.encode(), value.encode())

    async def get(self, key: str) -> Stored | None:
        return await self.shards.get(self._shard(key), key.encode())

    async def cas(self, key: str, expected: str | None, value: str) -> tuple[bool, Stored | None]:
        """Swap in `value` if the key holds `expected`; (swapped, what it holds now)."""
        shard = self._shard(key)
        async with self._locked(key):
            current = await self.shards.get(shard, key.encode())
            if (None if current is None else current.value.decode()) != expected:
                return False, current
            generation = await self.shards.put(shard, key.encode(), value.encode())
            return True, Stored(value.encode(), generation)

    # -- HTTP ------------------------------------------------------------------------------

    def web_app(self, allow_remote_control: bool) -> web.Application:
        app = web.Application(client_max_size=MAX_VALUE_BYTES, middlewares=[errors_middleware])
        app.add_routes(host_routes(self.shards, allow_remote_control=allow_remote_control))
        app.add_routes([
            web.put("/kv/{key:.+}", self._http_put),
            web.get("/kv/{key:.+}", self._http_get),
            web.post("/cas/{key:.+}", self._http_cas),
            web.get("/shards", self._http_shards),
            web.get("/healthz", self._http_healthz),
        ])
        app.cleanup_ctx.append(lambda _: lifetime(self.shards))
        return app

    def _key(self, request: web.Request) -> str:
        key = request.match_info["key"]
        if len(key) > MAX_KEY_CHARS:
            raise BadRequest(f"a key has at most {MAX_KEY_CHARS} characters")
        return key

    def _answer(self, key: str, stored: Stored | None, **more: Any) -> dict[str, Any]:
        return {"key": key, "shard": self._shard(key),
                "value": None if stored is None else stored.value.decode(),
                "generation": None if stored is None else stored.generation, **more}

    async def _http_put(self, request: web.Request) -> web.Response:
        key = self._key(request)
        try:
            value = (await request.read()).decode()
        except UnicodeDecodeError:
            raise BadRequest("the value must be UTF-8 text") from None
        try:
            generation = await self.put(key, value)
        except NotOpen as e:
            raise self._misdirected(e, key) from None
        return web.json_response({"key": key, "shard": self._shard(key),
                                  "generation": generation})

    async def _http_get(self, request: web.Request) -> web.Response:
        key = self._key(request)
        try:
            stored = await self.get(key)
        except NotOpen as e:
            raise self._misdirected(e, key) from None
        served_by = self.shards.open_shards[self._shard(key)].generation
        return web.json_response(self._answer(key, stored, served_by=served_by),
                                 status=404 if stored is None else 200)

    async def _http_cas(self, request: web.Request) -> web.Response:
        key = self._key(request)
        body = await json_body(request, MAX_VALUE_BYTES * 2 + 1024)
        expected, value = body.get("expected"), body.get("value")
        if not isinstance(value, str) or not (expected is None or isinstance(expected, str)):
            raise BadRequest('the body must be {"expected": string or null, "value": string}')
        try:
            swapped, stored = await self.cas(key, expected, value)
        except NotOpen as e:
            raise self._misdirected(e, key) from None
        return web.json_response(self._answer(key, stored, swapped=swapped))

    async def _http_healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _http_shards(self, _: web.Request) -> web.Response:
        return web.json_response({
            "shards": self.shards.shards, "holder": self.shards.holder,
            "open": {str(n): {"generation": s.generation}
                     for n, s in sorted(self.shards.open_shards.items()) if not s.closed},
            "stats": self.shards.stats})


def open_records(out: TextIO, instance: str) -> Any:
    """A `SlateShards.record` hook writing `shardlease verify --opens` lines
    (docs/verify.md): one clock, monotonic nanoseconds, for every process
    of this machine."""

    def record(event: str, shard: int, generation: int | None) -> None:
        out.write(json.dumps({"shard": shard, "instance": instance, "event": event,
                              "time": time.monotonic_ns(), "generation": generation}) + "\n")
        out.flush()

    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m shardlease_examples.slatekv",
        description="A sharded key-value service, every shard a SlateDB database, "
                    "fenced by the shardlease generation.")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--store", default=os.environ.get("SLATEKV_STORE"),
                        help="s3://BUCKET[/PREFIX][?endpoint=URL&region=R&path_style=true] "
                             "(default $SLATEKV_STORE)")
    parser.add_argument("--shards", type=int,
                        default=int(os.environ.get("SLATEKV_SHARDS", "0") or 0))
    parser.add_argument("--agent", metavar="URL", help="the agent's URL, for a 421's hint")
    parser.add_argument("--allow-remote-control", action="store_true",
                        help="accept open/close from other hosts than loopback")
    parser.add_argument("--manifest-poll-ms", type=int,
                        help="SlateDB's manifest poll interval (its default: 1 s)")
    parser.add_argument("--opens", metavar="FILE",
                        help="append an open/close record per writer (shardlease verify --opens)")
    parser.add_argument("--instance", default=None,
                        help="this instance's name in the --opens records (default: host/pid)")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s slatekv %(message)s")
    for noisy in ("botocore", "aiobotocore", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.store:
        print("slatekv: error: --store s3://BUCKET[/PREFIX] is required", file=sys.stderr)
        return 2
    try:
        shards = SlateShards(Bucket.from_url(args.store), args.shards,
                             settings=default_settings(args.manifest_poll_ms))
    except (ConfigError, ValueError) as e:
        print(f"slatekv: error: {e}", file=sys.stderr)
        return 2
    opens = open(args.opens, "a") if args.opens else None
    if opens is not None:
        shards.record = open_records(opens, args.instance or shards.holder)
    app = KV(shards, (args.agent or "").rstrip("/") or None).web_app(args.allow_remote_control)
    if args.parent_pid:
        async def watch_parent(_: web.Application) -> AsyncIterator[None]:
            async def watch() -> None:
                while os.getppid() == args.parent_pid:  # noqa: ASYNC110 - no event for it
                    await asyncio.sleep(0.5)
                os.kill(os.getpid(), signal.SIGTERM)

            task = asyncio.create_task(watch())
            yield
            task.cancel()

        app.cleanup_ctx.append(watch_parent)
    log.info("serving %d shards on %s:%d, databases under %s", args.shards, args.bind,
             args.port, args.store.split("?", 1)[0])
    web.run_app(app, host=args.bind, port=args.port, access_log=None, print=None,
                shutdown_timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
