"""The sidecar host: the application container answers on localhost.

Protocol (JSON over HTTP, any 2xx is success):
    POST {base}/shards/{shard}/open   {"shard": S, "generation": G, "validity_ms": V}
    POST {base}/shards/{shard}/close  {"shard": S, "generation": G}
    POST {base}/lease                 {"leases": [{"shard": S, "generation": G,
                                                   "validity_ms": V}, ...]}
    POST {base}/shards/{shard}/abort  {"shard": S, "generation": G}

Every call carries the generation it is about: the close names the open it
closes. Calls are idempotent per (shard, generation), and an application must
ignore a call whose generation is older than the newest it has seen for that
shard, and refuse an open of a generation it has already closed: cancelling
an HTTP request does not stop the application's handler, so a slow open may
arrive, or finish, after the close that was meant to follow it
(examples/shardlease_examples/shardapp.py does exactly this).

Validity: `validity_ms` is how long, in milliseconds from when the call
reaches the application, it may act on the shard without hearing more: the
agent's own deadline for the shard (last renewal sent + lease_ttl - margin)
minus the time the call is sent. The agent closes the shard at that deadline
(self-fencing); an application that keeps its own deadline per (shard,
generation), on its monotonic clock, stops acting at the same moment when the
agent cannot tell it to (paused, OOM-killed, cut off), so a stalled agent no
longer leaves a live application acting beside the shard's next owner. Past
its deadline the application acts as if the shard were closed (refuses its
requests) until a later `/lease` (or open) of that same generation extends
it. The margin must cover the delivery of a call (a few milliseconds on
localhost). Once per renewal pass the agent sends one `/lease` with every
shard whose deadline moved; it runs beside the renewals and never delays one.
`/lease` entries name a generation: an entry for a generation other than the
one the application has (or is opening) for the shard is ignored; an entry
may arrive before the open it extends has finished, and counts for it then.
An application that does not keep deadlines ignores `validity_ms` and may
answer `/lease` with any 2xx.

A newer generation: an application whose storage (or memory) holds a
generation for the shard at or above the one asked, that it did not open
itself in this process, refuses the open with 409 and a JSON body naming it:
    {"error": "outdated_generation", "highest_generation": N, ...}
The agent then frees the lease with its generation raised to N, so the next
claim (by any node) is at N + 1 or above. That is how a lease store that lost
its records (a store change, a deleted or garbage record, every node
restarted) never hands out a generation twice: the application is the one
party that always knows the last one. An application that cannot tell gives
any other non-2xx answer, which counts as a failed open.

Abort: when a fenced close did not end before the lease could be taken by
another node, the agent gives up on it and says `abort`: drop the shard at
once (the generation still fences whatever the application does late).

The runner bounds each call with the options' `open_timeout` and
`close_timeout`, and `/lease` with the interval, and retries closes; this
class makes one attempt per call, with those same bounds and, for `abort`
alone, a short one of its own (`abort_timeout`), and turns every failure into
`HostError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import aiohttp

from shardlease.errors import HostError, OutdatedGeneration
from shardlease.hosts.base import Validity

#: Seconds an abort may take: it is best effort, sent when a close already failed.
ABORT_TIMEOUT = 2.0


#: The most of an error answer read (a refusal's JSON is far smaller).
MAX_ERROR_CHARS = 4096
#: A highest generation the agent could not claim above (a signed 64-bit
#: integer's range, where applications keep the token) is no answer.
MAX_HIGHEST = 2**63 - 1


def outdated(what: str, body: Mapping[str, Any], text: str) -> None:
    """Raise `OutdatedGeneration` if a 409 answer to an open names a highest
    generation at or above the one asked (the protocol above); anything else
    (no JSON, no such field, a generation below the one asked) is left to be
    an ordinary failed open."""
    try:
        doc = json.loads(text)
    except ValueError:
        return
    highest = doc.get("highest_generation") if isinstance(doc, dict) else None
    generation = body.get("generation")
    if not isinstance(highest, int) or isinstance(highest, bool) \
            or not isinstance(generation, int) or not generation <= highest < MAX_HIGHEST:
        return
    raise OutdatedGeneration(
        f"{what}: the application has seen generation {highest} (asked {generation}): "
        "freed to be claimed above it", shard=body["shard"], generation=generation,
        highest=highest)


def validity_ms(seconds: float) -> int:
    """Whole milliseconds, rounded down (never more than the agent allows)."""
    return max(0, math.floor(seconds * 1000))


class HttpHost:
    def __init__(self, base_url: str, *, open_timeout: float | None = None,
                 close_timeout: float | None = None,
                 abort_timeout: float = ABORT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = {"open": aiohttp.ClientTimeout(total=open_timeout),
                         "close": aiohttp.ClientTimeout(total=close_timeout),
                         "abort": aiohttp.ClientTimeout(total=abort_timeout),
                         "lease": aiohttp.ClientTimeout(total=None)}
        #: The generation of the last open of each shard, for its close.
        self.generations: dict[int, int] = {}
        self._session: aiohttp.ClientSession | None = None

    def configure(self, base_url: str, *, open_timeout: float | None = None,
                  close_timeout: float | None = None) -> None:
        """A new base URL and timeouts, for the calls that start from now on
        (the agent applies a ShardSet change in place; a call running keeps
        the URL and timeout it started with)."""
        self.base_url = base_url.rstrip("/")
        self.timeouts = {**self.timeouts, "open": aiohttp.ClientTimeout(total=open_timeout),
                         "close": aiohttp.ClientTimeout(total=close_timeout)}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No session-wide timeout: each call has its own (above).
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _call(self, what: str, path: str, action: str, body: Mapping[str, Any]) -> None:
        url = f"{self.base_url}{path}"
        try:
            async with self._client().post(url, json=body,
                                           timeout=self.timeouts[action]) as resp:
                if resp.status // 100 != 2:
                    text = (await resp.text())[:MAX_ERROR_CHARS]
                    if action == "open" and resp.status == 409:
                        outdated(what, body, text)
                    raise HostError(f"{what}: {url} answered {resp.status}: {text[:200]}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HostError(f"{what}: {url} failed: {e!r}") from e

    async def _post(self, shard: int, action: str, body: Mapping[str, Any]) -> None:
        await self._call(f"{action} shard {shard}", f"/shards/{shard}/{action}", action, body)

    async def open(self, shard: int, generation: int) -> None:
        self.generations[shard] = generation
        await self._post(shard, "open", {"shard": shard, "generation": generation})

    async def open_for(self, shard: int, generation: int, validity: float) -> None:
        self.generations[shard] = generation
        await self._post(shard, "open", {"shard": shard, "generation": generation,
                                         "validity_ms": validity_ms(validity)})

    async def close(self, shard: int) -> None:
        body = {"shard": shard}
        if shard in self.generations:
            body["generation"] = self.generations[shard]
        await self._post(shard, "close", body)

    async def extend(self, leases: Mapping[int, Validity]) -> None:
        entries = [{"shard": shard, "generation": v.generation,
                    "validity_ms": validity_ms(v.seconds)}
                   for shard, v in sorted(leases.items())]
        await self._call(f"lease of {len(entries)} shard(s)", "/lease", "lease",
                         {"leases": entries})

    async def abort(self, shard: int, generation: int) -> None:
        await self._post(shard, "abort", {"shard": shard, "generation": generation})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
