"""The placement loop on Kubernetes Leases when someone writes a bad Lease by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from shardlease.loop import PlacementLoop
from shardlease.options import Options
from shardlease.stores import open_store
from shardlease.stores.kubernetes import LABEL_CLUSTER, LABEL_KIND, LABEL_SHARD, lease_name
from shardlease.telemetry import Claim, CorruptLease, Event, Round, Telemetry

SHARDS = 4


class Host:
    def __init__(self, opened: dict[int, tuple[str, int]], name: str) -> None:
        self.opened, self.name = opened, name

    async def open(self, shard: int, generation: int) -> None:
        assert shard not in self.opened, (shard, self.opened[shard], self.name)
        self.opened[shard] = (self.name, generation)

    async def close(self, shard: int) -> None:
        self.opened.pop(shard, None)


async def test_a_hand_written_malformed_lease_is_reported_and_claimed_after_it_expires(
        namespace: str, kubeconfig: str, api_client: Any) -> None:
    # A Lease in our cluster's name and labels, but with no generation and a
    # holder nobody knows: what a confused human might write with kubectl.
    await client.CoordinationV1Api(api_client).create_namespaced_lease(namespace, {
        "metadata": {"name": lease_name("hand", 2),
                     "labels": {LABEL_CLUSTER: "hand", LABEL_SHARD: "2",
                                LABEL_KIND: "shard"}},
        "spec": {"holderIdentity": "someone-by-hand", "leaseDurationSeconds": 1}})
    events: list[Event] = []
    telemetry = Telemetry()
    telemetry.subscribe(events.append)
    opened: dict[int, tuple[str, int]] = {}
    # Per observer: each node's view of a shard's generation never goes back.
    generations: dict[tuple[str, int], list[int]] = {}
    loops = [PlacementLoop(open_store(f"kubernetes://{namespace}"), Host(opened, n),
                           Options.make(shards=SHARDS, lease_ttl=2, name=n, cluster_name="hand"),
                           telemetry=telemetry) for n in ("a", "b")]
    tasks = [asyncio.create_task(loop.run()) for loop in loops]
    try:
        async def settled() -> bool:
            for loop in loops:
                for o in loop.owners():
                    if o.owner is not None:
                        generations.setdefault((loop.name, o.shard), []).append(o.generation)
            return len(opened) == SHARDS
        deadline = asyncio.get_running_loop().time() + 60
        while not await settled():
            assert all(not t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            assert asyncio.get_running_loop().time() < deadline, f"opened: {opened}"
            await asyncio.sleep(0.2)
        corrupt = [e for e in events if isinstance(e, CorruptLease)]
        assert corrupt and all(e.shard == 2 for e in corrupt)
        assert "leaseTransitions" in corrupt[0].error or "generation" in corrupt[0].error
        # Claimed over the bad record with a generation above anything seen.
        assert opened[2][1] >= 1
        for key, seen in generations.items():
            assert seen == sorted(seen), (key, seen)
    finally:
        for loop in loops:
            await loop.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for loop in loops:
            await loop.store.aclose()
    assert opened == {}


@pytest.mark.parametrize("renewal", ["shard", "node"])
async def test_a_stopped_nodes_shards_are_claimed_in_a_round_the_lease_watch_woke(
        namespace: str, kubeconfig: str, renewal: str) -> None:
    """No hint is sent here: the peer learns of the frees (or of the end of
    the epoch) from its store's watch of the Leases, and claims them in the
    round that woke, long before its next round of its time (interval 10 s)."""
    events: dict[str, list[Event]] = {"a": [], "b": []}
    opened: dict[int, tuple[str, int]] = {}
    loops = {}
    for n in ("a", "b"):
        telemetry = Telemetry()
        telemetry.subscribe(events[n].append)
        loops[n] = PlacementLoop(
            open_store(f"kubernetes://{namespace}"), Host(opened, n),
            Options.make(shards=SHARDS, lease_ttl=30, name=n, cluster_name=f"watch-{renewal}",
                         renewal=renewal),
            peers=lambda: {"a", "b"}, telemetry=telemetry)
    tasks = {n: asyncio.create_task(loop.run()) for n, loop in loops.items()}
    try:
        async def until(ok: Callable[[], bool], what: str) -> None:
            deadline = asyncio.get_running_loop().time() + 60
            while not ok():
                assert all(not t.done() for t in tasks.values()), what
                assert asyncio.get_running_loop().time() < deadline, f"{what}: {opened}"
                await asyncio.sleep(0.05)

        await until(lambda: len(opened) == SHARDS
                    and {o for o, _ in opened.values()} == {"a", "b"}, "both hold shards")
        theirs = {s for s, (o, _) in opened.items() if o == "b"}
        await loops["b"].stop()
        await tasks.pop("b")
        await until(lambda: all(opened.get(s, ("",))[0] == "a" for s in theirs),
                    "a took b's shards")
        a_events = events["a"]
        claims = {e.shard: i for i, e in enumerate(a_events)
                  if isinstance(e, Claim) and e.shard in theirs}
        assert set(claims) == theirs
        for shard, i in claims.items():
            after = next(e for e in a_events[i:] if isinstance(e, Round))
            assert after.hinted, (shard, after)
    finally:
        for loop in loops.values():
            await loop.stop()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for loop in loops.values():
            await loop.store.aclose()
