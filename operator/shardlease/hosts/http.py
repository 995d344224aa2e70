"""The sidecar host: the application container answers on localhost.

Protocol (JSON over HTTP, any 2xx is success):
    POST {base}/shards/{shard}/open   {"shard": S, "generation": G}
    POST {base}/shards/{shard}/close  {"shard": S}
The runner bounds each call with its own timeout and retries closes; this
class makes one attempt per call and turns every failure into `HostError`.
"""

from __future__ import annotations

import aiohttp

from shardlease.errors import HostError


class HttpHost:
    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _post(self, shard: int, action: str, body: dict[str, int]) -> None:
        url = f"{self.base_url}/shards/{shard}/{action}"
        try:
            async with self._client().post(url, json=body) as resp:
                if resp.status // 100 != 2:
                    text = (await resp.text())[:200]
                    raise HostError(f"{action} shard {shard}: {url} answered {resp.status}: {text}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HostError(f"{action} shard {shard}: {url} failed: {e!r}") from e

    async def open(self, shard: int, generation: int) -> None:
        await self._post(shard, "open", {"shard": shard, "generation": generation})

    async def close(self, shard: int) -> None:
        await self._post(shard, "close", {"shard": shard})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
