"""The operator's HTTP endpoints: /healthz, /readyz and /metrics (port 8080).

kopf's own liveness endpoint serves one path and no metrics, so the operator
serves its own. Readiness means "can decide an injection right now": the
StatefulSet cache is warm (listed once at start) and, when the webhook is
configured, its TLS port accepts connections. The chart points the
Deployment's readiness probe here, so a replica starting up is not sent
admission reviews it would answer from an empty cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        self.reconciles = Counter("shardlease_operator_reconciles",
                                  "StatefulSet reconciliations, by result", ["result"],
                                  registry=reg)
        self.retries_pending = Gauge("shardlease_operator_retries_pending",
                                     "StatefulSets whose reconciliation failed and waits "
                                     "for a retry", registry=reg)
        self.injections = Counter("shardlease_operator_injections",
                                  "Pods seen by the webhook, by outcome (injected, skipped)",
                                  ["result"], registry=reg)
        self.pods_without_agent = Gauge("shardlease_operator_pods_without_agent",
                                        "Ready pods of opted-in StatefulSets with no agent",
                                        registry=reg)
        self.stale_statuses = Counter("shardlease_operator_stale_statuses",
                                      "ShardSet statuses marked Balanced=Unknown", registry=reg)
        self.shardsets = Gauge("shardlease_operator_shardsets", "ShardSets seen", registry=reg)


class ProbeServer:
    def __init__(self, metrics: OperatorMetrics, *, warm: asyncio.Event,
                 webhook: tuple[str, int] | None, alive: Callable[[], str | None]) -> None:
        self.metrics = metrics
        self.warm = warm
        self.webhook = webhook
        self.alive = alive
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.add_routes([web.get("/healthz", self._healthz), web.get("/readyz", self._readyz),
                        web.get("/metrics", self._metrics)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        problem = self.alive()
        return web.Response(status=500 if problem else 200, text=f"{problem or 'ok'}\n")

    async def _webhook_serving(self) -> bool:
        if self.webhook is None:
            return True
        host, port = self.webhook
        try:
            async with asyncio.timeout(2.0):
                _, writer = await asyncio.open_connection(
                    "127.0.0.1" if host in ("0.0.0.0", "") else host, port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _readyz(self, _: web.Request) -> web.Response:
        if not self.warm.is_set():
            return web.Response(status=503, text="the StatefulSet cache is not warm yet\n")
        if not await self._webhook_serving():
            return web.Response(status=503, text="the webhook is not serving yet\n")
        return web.Response(text="ready\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
