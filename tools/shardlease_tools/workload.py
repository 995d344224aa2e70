"""Clients of a sharded key-value service (shardlease_examples.slatekv's API)
that record what they saw as `shardlease verify` histories (docs/verify.md).

Each operation's invocation and completion are monotonic nanoseconds (one
clock for every process of this machine), its outcome (ok, failed: every
answer said nothing was applied, unknown: an answer was lost or may hide an
effect) and the generation its value was stored under. A request goes first
to the app that owns the key's shard (the last app that answered for it, or
the owner the lease store names, when told by `owners`), then to the others
(a 421 sends it on).

Used by `shardlease verify`'s run mode and by tests/examples/test_slatekv.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

import aiohttp

from shardlease.routing import shard_for_key
from shardlease_tools.verify import Operation

Outcome = Literal["ok", "failed", "unknown"]

#: Rounds of asking every app before an operation counts as failed.
ROUNDS = 40
#: Seconds between two rounds.
ROUND_PAUSE = 0.1


async def call(http: aiohttp.ClientSession, method: str, url: str,
               **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """(status, JSON body); status 0 when no answer came."""
    try:
        async with http.request(method, url, **kwargs) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = {"text": await resp.text()}
            return resp.status, body if isinstance(body, dict) else {"body": body}
    except (aiohttp.ClientError, TimeoutError) as e:
        return 0, {"error": repr(e)}


class Workload:
    """Clients of the key-value API recording a `shardlease verify` history.

    `apps`: app name -> base URL (may change while it runs: a restarted app
    keeps its name). `owners`: shard -> the app name its lease's owner runs
    beside, kept up to date by the caller (optional: a hint, tried first)."""

    def __init__(self, http: aiohttp.ClientSession, apps: Mapping[str, str], shards: int,
                 keys: int = 16, seed: int = 39, *, cas: float = 0.0, writes: float = 0.6,
                 owners: Mapping[int, str] | None = None) -> None:
        self.http, self.apps, self.shards = http, apps, shards
        self.keys = [f"key{i}" for i in range(keys)]
        self.ops: list[Operation] = []
        self.route: dict[int, str] = {}
        self.owners: Mapping[int, str] = owners if owners is not None else {}
        self.random = random.Random(seed)
        self.cas_share, self.write_share = cas, writes
        #: key -> the last value a client saw (what a cas expects).
        self.seen: dict[str, str | None] = {}

    def _order(self, shard: int) -> list[str]:
        first = [n for n in (self.route.get(shard), self.owners.get(shard)) if n]
        rest = sorted(set(self.apps) - set(first))
        return list(dict.fromkeys(first)) + rest

    async def _ask(self, key: str, method: str, path: str, **kwargs: Any
                   ) -> tuple[Outcome, dict[str, Any]]:
        """Try the apps until one answers for the key's shard: ("ok", body),
        ("failed", body) when every answer said nothing was applied, or
        ("unknown", body) at the first answer that may hide an effect."""
        shard = shard_for_key(key, self.shards)
        body: dict[str, Any] = {}
        for _ in range(ROUNDS):
            for name in self._order(shard):
                url = self.apps.get(name)
                if url is None:
                    continue
                status, body = await call(self.http, method, f"{url}{path}", **kwargs)
                if status in (200, 404):
                    self.route[shard] = name
                    return "ok", body
                if status == 0 or body.get("applied") == "unknown":
                    return "unknown", body
            await asyncio.sleep(ROUND_PAUSE)
        return "failed", body

    async def write(self, client: int, key: str, value: str) -> None:
        invoked = time.monotonic_ns()
        outcome, body = await self._ask(key, "PUT", f"/kv/{key}", data=value.encode())
        self.ops.append(Operation(
            client=client, op="write", key=key, value=value, invoked=invoked,
            completed=time.monotonic_ns(), outcome=outcome,
            generation=body.get("generation") if outcome == "ok" else None,
            shard=shard_for_key(key, self.shards)))
        if outcome == "ok":
            self.seen[key] = value

    async def read(self, client: int, key: str, final: bool = False) -> None:
        invoked = time.monotonic_ns()
        outcome, body = await self._ask(key, "GET", f"/kv/{key}")
        # A read that did not answer constrains nothing: it is left out.
        if outcome == "ok":
            self.ops.append(Operation(
                client=client, op="read", key=key, value=body["value"], invoked=invoked,
                completed=time.monotonic_ns(), outcome="ok", generation=body["generation"],
                shard=shard_for_key(key, self.shards), final=final))
            self.seen[key] = body["value"]

    async def cas(self, client: int, key: str, expected: str | None, value: str) -> None:
        invoked = time.monotonic_ns()
        outcome, body = await self._ask(key, "POST", f"/cas/{key}",
                                        json={"expected": expected, "value": value})
        swapped = bool(body.get("swapped")) if outcome == "ok" else None
        self.ops.append(Operation(
            client=client, op="cas", key=key, expected=expected, value=value,
            invoked=invoked, completed=time.monotonic_ns(), outcome=outcome, swapped=swapped,
            # Swapped: the generation that stored it; else the one stored
            # with the value found (an owner of the shard, open before).
            generation=body.get("generation") if outcome == "ok" else None,
            shard=shard_for_key(key, self.shards)))
        if outcome == "ok":
            self.seen[key] = body.get("value")

    async def client(self, client: int, stop: asyncio.Event) -> None:
        """Operations on random keys until `stop`; every value written is unique."""
        n = 0
        while not stop.is_set():
            key = self.random.choice(self.keys)
            draw = self.random.random()
            if draw < self.cas_share:
                n += 1
                await self.cas(client, key, self.seen.get(key), f"c{client}-{n}")
            elif draw < self.cas_share + self.write_share:
                n += 1
                await self.write(client, key, f"c{client}-{n}")
            else:
                await self.read(client, key)

    async def read_back(self, client: int = 10_000) -> list[str]:
        """The final read of every key (`"final": true`); the keys that could
        not be read back."""
        for key in self.keys:
            await self.read(client, key, final=True)
        read = {op.key for op in self.ops if op.final}
        return [k for k in self.keys if k not in read]

    def acknowledged(self, since: int = 0) -> Counter[tuple[int | str | None, int | None]]:
        """(shard, generation) of the acknowledged writes from op `since` on."""
        return Counter((op.shard, op.generation) for op in self.ops[since:]
                       if op.acknowledged_write)
