"""A host that only logs: `--host log`, for trying the loop out."""

from __future__ import annotations

import logging

logger = logging.getLogger("shardlease.host")


class LogHost:
    def __init__(self, node: str = "") -> None:
        self.node = node

    async def open(self, shard: int, generation: int) -> None:
        logger.info("open shard=%d generation=%d node=%s", shard, generation, self.node)

    async def close(self, shard: int) -> None:
        logger.info("close shard=%d node=%s", shard, self.node)
