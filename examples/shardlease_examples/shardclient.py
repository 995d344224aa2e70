"""A client of the example app: write keys through whichever instance owns them,
then read them back.

    python -m shardlease_examples.shardclient write  --apps URL[,URL...] --count 200
    python -m shardlease_examples.shardclient verify --apps URL[,URL...] --count 200

Each key goes first to the instance that last accepted its shard, then to the
others: a 421 (shard not open there) or a 409 (fenced) sends it on; a shard
between owners is retried until `--timeout`. `write` stores ``PREFIX-I`` =
``PREFIX-I@RUN`` for I in 0..COUNT-1; `verify` reads them back and expects
those values. One JSON line of results on stdout; exit status 0 when every key
was written (or read back with its value), 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from shardlease.routing import shard_for_key


@dataclass
class Router:
    """Sends one request for a key to the instance that has its shard open."""

    http: aiohttp.ClientSession
    apps: list[str]
    shards: int
    timeout: float = 60.0
    route: dict[int, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def send(self, method: str, key: str, data: bytes | None = None
                   ) -> tuple[int, dict[str, Any]]:
        """(status, body) from the owner; (0, last answer) if none answered in time."""
        shard = shard_for_key(key, self.shards)
        end = time.monotonic() + self.timeout
        last: dict[str, Any] = {}
        while True:
            first = self.route.get(shard)
            for app in ([first] if first else []) + [a for a in self.apps if a != first]:
                try:
                    async with self.http.request(method, f"{app}/kv/{key}", data=data) as resp:
                        body = await resp.json(content_type=None)
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                    self._count("unreachable")
                    last = {"error": repr(e), "app": app}
                    continue
                if status in (421, 409):
                    self._count(f"http_{status}")
                    last = body
                    continue
                if status in (200, 404):
                    self.route[shard] = app
                return status, body
            if time.monotonic() > end:
                return 0, last
            await asyncio.sleep(0.5)


async def run(args: argparse.Namespace) -> int:
    apps = [a.rstrip("/") for a in args.apps.split(",") if a.strip()]
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        router = Router(http, apps, args.shards, timeout=args.timeout)
        ok, failed = 0, []
        for i in range(args.count):
            key = f"{args.prefix}-{i}"
            expected = f"{key}@{args.run}"
            if args.command == "write":
                status, body = await router.send("PUT", key, expected.encode())
                good = status == 200
            else:
                status, body = await router.send("GET", key)
                good = status == 200 and body.get("value") == expected
            if good:
                ok += 1
            else:
                failed.append({"key": key, "status": status, "answer": body})
    result = {"command": args.command, "keys": args.count, "ok": ok,
              "failed": len(failed), "redirects": router.counts, "first_failures": failed[:5]}
    print(json.dumps(result, sort_keys=True))
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardlease_examples.shardclient",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("write", "verify"))
    parser.add_argument("--apps", required=True, help="comma-separated base URLs of the app")
    parser.add_argument("--shards", type=int, required=True, help="the app's number of shards")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--prefix", default="demo")
    parser.add_argument("--run", default="1", help="tag stored in each value")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to keep retrying one key (60)")
    args = parser.parse_args(argv)
    if args.shards < 1 or args.count < 0:
        parser.error("--shards must be >= 1 and --count >= 0")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
