"""A recording host: `--host record:PATH`, for tests and the demo.

It opens and closes nothing; it appends one JSON line per event to PATH, so
that `shardlease.checker` can later verify that no shard was ever open on two
nodes at once with valid deadlines. Each line is one `write(2)` on a file
opened with O_APPEND, so several processes may share one file (or use one file
per node) and a killed process leaves no torn line behind.

Lines carry `event`, `node`, `pid`, `wall` (time.time()) and, for shards,
`shard` and `generation`. Events: `open_start`/`open_end`/`close_start`/
`close_end` (the host calls), `deadline` (the runner's deadline for a shard
moved, in wall time), and the loop's telemetry (`claim`, `release`, `lost`,
`self_fence`, `opened`, `closed`), plus `node_start` and `node_stop`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from shardlease.telemetry import Claim, Closed, Event, Lost, Opened, Release, SelfFence

#: Returns a shard's deadline in wall time (None if the runner has none).
DeadlineOf = Callable[[int], float | None]


class RecordHost:
    def __init__(self, path: str, node: str, deadline_of: DeadlineOf | None = None) -> None:
        self.path = path
        self.node = node
        self.pid = os.getpid()
        #: Set by whoever builds the loop, so open lines carry the deadline.
        self.deadline_of = deadline_of
        self._generation: dict[int, int] = {}
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def record(self, event: str, **fields: Any) -> None:
        line = {"event": event, "node": self.node, "pid": self.pid, "wall": time.time(), **fields}
        os.write(self._fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())

    def _deadline(self, shard: int) -> dict[str, float]:
        deadline = self.deadline_of(shard) if self.deadline_of is not None else None
        return {} if deadline is None else {"deadline_wall": deadline}

    async def open(self, shard: int, generation: int) -> None:
        self._generation[shard] = generation
        self.record("open_start", shard=shard, generation=generation, **self._deadline(shard))
        self.record("open_end", shard=shard, generation=generation)

    async def close(self, shard: int) -> None:
        generation = self._generation.get(shard)
        self.record("close_start", shard=shard, generation=generation)
        self.record("close_end", shard=shard, generation=generation)

    def deadline_moved(self, shard: int, generation: int, deadline_wall: float) -> None:
        self.record("deadline", shard=shard, generation=generation, deadline_wall=deadline_wall)

    def on_event(self, event: Event) -> None:
        """A telemetry subscriber: records what the checker and the demo count."""
        match event:
            case Opened(shard=shard, generation=generation, deadline_wall=deadline):
                self.record("opened", shard=shard, generation=generation, deadline_wall=deadline)
            case Closed(shard=shard, reason=reason):
                self.record("closed", shard=shard, reason=reason)
            case Claim(shard=shard, generation=generation):
                self.record("claim", shard=shard, generation=generation)
            case Release(shard=shard) | Lost(shard=shard):
                self.record(event.kind, shard=shard)
            case SelfFence(shards=shards):
                self.record("self_fence", shards=list(shards))
            case _:
                pass

    def close_file(self) -> None:
        os.close(self._fd)
