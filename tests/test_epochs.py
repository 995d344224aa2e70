"""EpochWatch on its own: garbage collection of other nodes' epochs."""

from __future__ import annotations

import asyncio
import random

from shardlease.calls import Calls
from shardlease.clock import LoopClock
from shardlease.epochs import EpochWatch
from shardlease.records import Epoch
from shardlease.sim.vloop import run_virtual
from shardlease.stores.memory import MemoryStore
from shardlease.telemetry import Telemetry


async def _collect_times(epoch_ttl: float, own_ttl: float) -> float | None:
    """When `a` (TTL `own_ttl`) deletes the epoch of a silent `b` whose
    record says TTL `epoch_ttl`; None if not within 400 s."""
    store = MemoryStore()
    clock = LoopClock()
    await store.create_epoch(Epoch(cluster="c", node="b", epoch="e1", seq=1, write_id="w",
                                   at=0.0, ttl=epoch_ttl))
    calls = Calls(interval=own_ttl / 3, ttl=own_ttl, clock=clock, rng=random.Random(0))
    watch = EpochWatch(store, calls, clock, Telemetry(), cluster="c", name="a",
                       ttl=lambda: own_ttl, own=lambda: "mine")
    start = clock.monotonic()
    while clock.monotonic() - start < 400:
        epochs = await watch.read()
        assert epochs is not None
        if ("b", "e1") not in epochs:
            return clock.monotonic() - start
        watch.observe(epochs, {})
        await watch.collect({})
        await asyncio.sleep(own_ttl / 3)
    return None


def test_a_silent_epoch_is_collected_after_twice_the_longer_ttl() -> None:
    # Finding A: the collector's own TTL (15 s) is not enough for an epoch
    # whose record says 90 s: its owner may still be valid for 87.5 s.
    took = run_virtual(_collect_times(epoch_ttl=90.0, own_ttl=15.0))
    assert took is not None and took > 2 * 90.0
    took = run_virtual(_collect_times(epoch_ttl=15.0, own_ttl=90.0))
    assert took is not None and took > 2 * 90.0
    took = run_virtual(_collect_times(epoch_ttl=15.0, own_ttl=15.0))
    assert took is not None and 2 * 15.0 < took <= 2 * 15.0 + 2 * 5.0
