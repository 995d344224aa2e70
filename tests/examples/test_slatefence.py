"""The fencing of SlateDB shards (shardlease_examples.slatefence), in this
process, on a real MinIO server: two instances of the library, each with its
own writer and its own holder name, as two pods would have.

Each test names the rule it shows; none depends on how long something took,
except the validity test, which waits out a deadline it set.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from slatedb.uniffi import CloseReason, Error  # type: ignore[import-untyped]

from shardlease_examples.slatefence import (
    Bucket,
    Fenced,
    NotOpen,
    Outdated,
    SlateShards,
    Unavailable,
    default_settings,
)
from tests.support.s3server import S3Server

pytest_plugins = ["tests.support.s3server"]

Make = Callable[..., SlateShards]


@pytest.fixture
async def make(minio: S3Server) -> AsyncIterator[Make]:
    """Instances of the library on one fresh bucket; each one's open and close
    records go to `.log` (a list of (event, shard, generation))."""
    url = minio.url(minio.create_bucket(), "kv")
    made: list[SlateShards] = []

    def new(cls: type[SlateShards] = SlateShards) -> SlateShards:
        log: list[tuple[str, int, int | None]] = []
        shards = cls(Bucket.from_url(url), 4, settings=default_settings(200),
                     record=lambda *event: log.append(event))
        shards.log = log  # type: ignore[attr-defined]
        made.append(shards)
        return shards

    yield new
    for shards in made:
        await shards.aclose()


async def test_a_newer_open_fences_the_older_writer(make: Make) -> None:
    a, b = make(), make()
    await a.open(0, 1, 60)
    assert await a.put(0, b"k1", b"v1") == 1
    await b.open(0, 2, 60)
    # SlateDB's put() takes the write; only its durability fails, and the
    # library says so: never acknowledged, and maybe applied.
    with pytest.raises(Fenced) as refused:
        await a.put(0, b"k2", b"stale")
    assert refused.value.details["fenced_by"] == 2
    assert refused.value.details["applied"] == "unknown"
    assert 0 not in a.open_shards and a.stats["fences"] == 1
    with pytest.raises(NotOpen):
        await a.get(0, b"k1")
    # The new owner has the acknowledged write, stamped with its owner's
    # generation, and not the refused one.
    got = await b.get(0, b"k1")
    assert got is not None and (got.value, got.generation) == (b"v1", 1)
    assert await b.get(0, b"k2") is None
    assert await b.put(0, b"k2", b"v2") == 2
    assert a.log == [("open", 0, 1), ("close", 0, 1)]


async def test_the_guard_refuses_an_older_generations_open(make: Make) -> None:
    a, b = make(), make()
    await a.open(0, 5, 60)
    for late in (4, 5):  # older, and the same generation opened by another holder
        with pytest.raises(Outdated) as refused:
            await b.open(0, late, 60)
        assert refused.value.details["highest_generation"] == 5
    # Refused at the guard: b never opened SlateDB, so a was not fenced.
    assert b.log == [] and 0 not in b.open_shards
    assert await a.put(0, b"k", b"v") == 5
    # A retry of a's own open (its answer lost) is no other owner's.
    assert (await a.open(0, 5, 60)).generation == 5


class Held(SlateShards):
    """Opens SlateDB only once `go` is set: an open that passed the guard and
    reaches SlateDB late."""

    go: asyncio.Event
    at_writer: asyncio.Event

    async def _writer(self, shard: int, generation: int) -> Any:
        self.at_writer.set()
        await self.go.wait()
        return await super()._writer(shard, generation)


async def test_an_open_overtaken_by_a_newer_one_steps_back_and_the_owner_reopens(
        make: Make) -> None:
    late = make(Held)
    assert isinstance(late, Held)
    late.go, late.at_writer = asyncio.Event(), asyncio.Event()
    owner = make()
    opening = asyncio.create_task(late.open(0, 3, 60))
    await late.at_writer.wait()  # the guard says 3 now
    await owner.open(0, 4, 60)
    assert await owner.put(0, b"k", b"before") == 4
    late.go.set()
    # Its writer fenced the owner's; the guard then shows 4, so it closes.
    with pytest.raises(Outdated) as refused:
        await opening
    assert refused.value.details["highest_generation"] == 4
    assert late.log == [("open", 0, 3), ("close", 0, 3)] and late.stats["opens_overtaken"] == 1
    # The owner's next write meets the fence: not acknowledged, and the owner,
    # still the newest generation at the guard, reopens its writer.
    with pytest.raises(Unavailable) as refused_write:
        await owner.put(0, b"k", b"fenced")
    assert refused_write.value.details["applied"] == "unknown"
    assert owner.stats["reopens"] == 1 and 0 in owner.open_shards
    assert await owner.put(0, b"k", b"after") == 4
    got = await owner.get(0, b"k")
    assert got is not None and (got.value, got.generation) == (b"after", 4)


async def test_reads_are_refused_past_the_validity_and_after_a_newer_generation(
        make: Make) -> None:
    a = make()
    # Without the expiry watchdog (below): a shard past its validity stays
    # open but serves nothing until a /lease of its generation revives it.
    a.close_on_expiry = False
    await a.open(0, 1, 3.0)
    deadline = a.valid_until[0][1]
    assert await a.get(0, b"k") is None  # served: inside its validity
    await asyncio.sleep(max(0.0, deadline - time.monotonic()) + 0.05)
    for attempt in (a.get(0, b"k"), a.put(0, b"k", b"late")):
        with pytest.raises(NotOpen) as refused:
            await attempt
        assert refused.value.details.get("expired") is True
    # A /lease of another generation does not revive it; one of its own does.
    assert not a.extend(0, 0, time.monotonic() + 60)
    assert a.extend(0, 1, time.monotonic() + 60)
    await a.put(0, b"k", b"v")
    got = await a.get(0, b"k")
    assert got is not None and got.value == b"v"
    # The agent claimed generation 2 (its /lease says so): 1 is no longer current.
    assert a.extend(0, 2, time.monotonic() + 60)
    with pytest.raises(NotOpen):
        await a.get(0, b"k")


async def test_a_shard_past_its_validity_has_its_writer_shut_down(make: Make) -> None:
    """The agent paused past its lease: its shard's validity runs out, and the
    writer is shut down (a close recorded) before a newer owner can open."""
    a = make()
    await a.open(0, 1, 1.0)
    db = a.open_shards[0].db
    a.extend(0, 1, time.monotonic() + 1.0)  # a /lease extends it once
    await asyncio.sleep(0.6)
    assert 0 in a.open_shards  # still inside the extended validity
    for _ in range(100):
        if 0 not in a.open_shards:
            break
        await asyncio.sleep(0.05)
    assert 0 not in a.open_shards and a.log[-1] == ("close", 0, 1)
    assert a.stats["expired_closes"] == 1
    with pytest.raises(Error.Closed):
        await db.get(b"k")
    with pytest.raises(NotOpen):
        await a.get(0, b"k")


async def test_close_lets_writes_finish_shuts_slatedb_down_and_the_next_owner_reads_them(
        make: Make) -> None:
    a, b = make(), make()
    await a.open(1, 1, 60)
    db = a.open_shards[1].db
    keys = [f"k{i}".encode() for i in range(20)]
    assert await asyncio.gather(*(a.put(1, k, k + b"=v") for k in keys[:10])) == [1] * 10
    # Ten more in flight when the close comes: it lets them become durable
    # (and be acknowledged) before it shuts SlateDB down.
    in_flight = [asyncio.create_task(a.put(1, k, k + b"=v")) for k in keys[10:]]
    await asyncio.sleep(0)
    assert a.open_shards[1].writing == 10
    assert await a.close(1, 1) is True
    assert await asyncio.gather(*in_flight) == [1] * 10
    assert a.log[-1] == ("close", 1, 1)
    # Shut down, not just forgotten: its writer refuses everything now.
    with pytest.raises(Error.Closed) as closed:
        await db.get(b"k0")
    assert closed.value.reason == CloseReason.CLEAN
    with pytest.raises(Outdated):  # a late open of the closed generation
        await a.open(1, 1, 60)
    await b.open(1, 2, 60)
    for k in keys:
        got = await b.get(1, k)
        assert got is not None and (got.value, got.generation) == (k + b"=v", 1)
