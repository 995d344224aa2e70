"""The sidecar host: the application container answers on localhost.

Protocol (JSON over HTTP, any 2xx is success):
    POST {base}/shards/{shard}/open   {"shard": S, "generation": G}
    POST {base}/shards/{shard}/close  {"shard": S, "generation": G}

Every call carries the generation it is about: the close names the open it
closes. Calls are idempotent per (shard, generation), and an application must
ignore a call whose generation is older than the newest it has seen for that
shard, and refuse an open of a generation it has already closed: cancelling
an HTTP request does not stop the application's handler, so a slow open may
arrive, or finish, after the close that was meant to follow it
(examples/shardapp does exactly this).

The runner bounds each call with the options' `open_timeout` and
`close_timeout` and retries closes; this class makes one attempt per call,
with those same bounds and no hidden one of its own, and turns every failure
into `HostError`.
"""

from __future__ import annotations

import aiohttp

from shardlease.errors import HostError


class HttpHost:
    def __init__(self, base_url: str, *, open_timeout: float | None = None,
                 close_timeout: float | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = {"open": aiohttp.ClientTimeout(total=open_timeout),
                         "close": aiohttp.ClientTimeout(total=close_timeout)}
        #: The generation of the last open of each shard, for its close.
        self.generations: dict[int, int] = {}
        self._session: aiohttp.ClientSession | None = None

    def configure(self, base_url: str, *, open_timeout: float | None = None,
                  close_timeout: float | None = None) -> None:
        """A new base URL and timeouts, for the calls that start from now on
        (the agent applies a ShardSet change in place; a call running keeps
        the URL and timeout it started with)."""
        self.base_url = base_url.rstrip("/")
        self.timeouts = {"open": aiohttp.ClientTimeout(total=open_timeout),
                         "close": aiohttp.ClientTimeout(total=close_timeout)}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No session-wide timeout: each call has its own (above).
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _post(self, shard: int, action: str, body: dict[str, int]) -> None:
        url = f"{self.base_url}/shards/{shard}/{action}"
        try:
            async with self._client().post(url, json=body,
                                           timeout=self.timeouts[action]) as resp:
                if resp.status // 100 != 2:
                    text = (await resp.text())[:200]
                    raise HostError(f"{action} shard {shard}: {url} answered {resp.status}: {text}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HostError(f"{action} shard {shard}: {url} failed: {e!r}") from e

    async def open(self, shard: int, generation: int) -> None:
        self.generations[shard] = generation
        await self._post(shard, "open", {"shard": shard, "generation": generation})

    async def close(self, shard: int) -> None:
        body = {"shard": shard}
        if shard in self.generations:
            body["generation"] = self.generations[shard]
        await self._post(shard, "close", body)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
