"""What opens and closes shards: the application, seen from the runner."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Host(Protocol):
    """The application side. The runner calls it, one call at a time per shard
    and in order: `close(shard)` always follows the `open` it closes.

    `generation` is the fencing token: the application must hand it to its
    storage so that writes from an older generation are refused there. That is
    what keeps a paused, stale owner harmless.
    """

    async def open(self, shard: int, generation: int) -> None: ...

    async def close(self, shard: int) -> None: ...
