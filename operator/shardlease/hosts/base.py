"""What opens and closes shards: the application, seen from the runner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol, runtime_checkable


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


class Validity(NamedTuple):
    """How long a shard's application may act without hearing more."""

    generation: int
    #: Seconds from when the call is made: the runner's deadline for the
    #: shard minus now. The runner fences the shard at that deadline, so an
    #: application that stops acting when it runs out (its own monotonic
    #: clock, from when the call reached it) stops when the runner would have
    #: closed it, also when the runner cannot tell it (paused, killed, cut off).
    seconds: float


@runtime_checkable
class LeasedHost(Host, Protocol):
    """A host that also learns each shard's validity (optional; the HTTP host
    is one). The runner then opens with `open_for` instead of `open`, sends
    `extend` once per renewal pass for the shards whose deadline moved, and
    `abort` when it abandons a fenced close.

    `extend` and `abort` run beside the shard's own calls (never delaying a
    renewal, an open or a close), so they may reach the application in any
    order with them: each names the generation it is about, and an
    application ignores one for a generation other than the one it has (or is
    opening) for the shard.
    """

    async def open_for(self, shard: int, generation: int, validity: float) -> None:
        """`open`, with the shard's validity in seconds."""

    async def extend(self, leases: Mapping[int, Validity]) -> None:
        """Every shard here may act for its validity more (one call per pass)."""

    async def abort(self, shard: int, generation: int) -> None:
        """The runner abandoned the shard's close (fenced, past its lease's
        expiry): drop it at once. Best effort, bounded by the host."""
