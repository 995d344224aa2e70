"""A paused agent and a live application: the application's own deadline.

Three `shardlease node` processes drive three example app processes (moto's
S3 on loopback, a file lease store). One node -- the agent, not its app -- is
stopped with SIGSTOP beyond the lease TTL: another node takes its shards and
opens them on another app. An app that keeps the validity the agent hands it
(`validity_ms` in the open, `POST /lease` every renewal pass) stops acting on
those shards at the moment the paused agent would have closed them, before
anyone may open them elsewhere; an app that ignores it (--ignore-validity)
acts on them beside their new owner until its storage fences it or the agent
resumes.

Measured from the apps' own histories (GET /history, on CLOCK_MONOTONIC,
which every process on the machine shares): the shard-seconds during which two
apps acted on one shard at once, in the SIGSTOP phase. Printed for both kinds
of app; asserted are orderings only: with deadlines kept, no two apps ever
acted on one shard at once and the stale app refused a write without asking
its storage; without, they did (the figure is not a wall-clock bound).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.s3server import S3Server

from .fleet import Fleet, Owners, wait_for
from .test_shardapp import keys_of

pytest_plugins = ["tests.support.s3server"]


@dataclass(frozen=True)
class Acting:
    """An app acting on a shard at a generation during [start, end)."""

    app: str
    shard: int
    generation: int
    start: float
    end: float


def acting_intervals(app: str, history: dict[str, Any], end: float) -> list[Acting]:
    """When `app` acted on each shard: from an open until a close, an abort or
    a fence, and -- if it keeps deadlines -- never past the deadline it held
    at each moment (opens and /lease calls move it)."""
    enforced = bool(history["enforced"])
    out: list[Acting] = []
    state: dict[int, tuple[int, float, float]] = {}  # shard -> (generation, since, until)

    def cut(shard: int, until_t: float) -> None:
        generation, since, until = state[shard]
        stop = min(until_t, until) if enforced else until_t
        if stop > since:
            out.append(Acting(app, shard, generation, since, stop))

    for ev in sorted(history["events"], key=lambda e: e["at"]):
        shard, at, generation = ev["shard"], ev["at"], ev["generation"]
        if ev["event"] == "open":
            if shard in state:
                cut(shard, at)
            state[shard] = (generation, at, ev["until"])
        elif ev["event"] == "lease" and shard in state and state[shard][0] == generation:
            cut(shard, at)
            state[shard] = (generation, at, max(state[shard][2], ev["until"]))
        elif ev["event"] in ("close", "abort", "fence") and shard in state \
                and (generation is None or generation >= state[shard][0]):
            cut(shard, at)
            del state[shard]
    for shard in list(state):
        cut(shard, end)
    return out


def double_owned(intervals: list[Acting], start: float, end: float) -> dict[int, float]:
    """Per shard, the seconds within [start, end) during which two or more
    apps acted on it at once."""
    by_shard: dict[int, list[Acting]] = defaultdict(list)
    for a in intervals:
        by_shard[a.shard].append(a)
    out: dict[int, float] = {}
    for shard, acts in by_shard.items():
        points = sorted({start, end, *(t for a in acts for t in (a.start, a.end)
                                       if start < t < end)})
        total = 0.0
        for lo, hi in itertools.pairwise(points):
            apps = {a.app for a in acts if a.start <= lo and a.end >= hi}
            if len(apps) >= 2:
                total += hi - lo
        if total > 0:
            out[shard] = total
    return out


def test_the_measure_counts_only_time_two_apps_acted_at_once() -> None:
    def ev(at: float, event: str, generation: int | None, **more: Any) -> dict[str, Any]:
        return {"at": at, "event": event, "shard": 0, "generation": generation, **more}

    a = {"enforced": True, "events": [ev(0, "open", 1, until=10), ev(8, "lease", 1, until=14),
                                      ev(20, "close", 1)]}
    b = {"enforced": True, "events": [ev(12, "open", 2, until=30), ev(16, "fence", 2)]}
    ignoring = {"enforced": False, "events": [ev(13, "open", 3, until=14)]}
    acts = [*acting_intervals("a", a, 40), *acting_intervals("b", b, 40)]
    assert [(x.app, x.start, x.end) for x in acts] == [("a", 0, 8), ("a", 8, 14), ("b", 12, 16)]
    assert double_owned(acts, -math.inf, math.inf) == {0: 2.0}
    assert double_owned(acts, 13, 20) == {0: 1.0}
    acts += acting_intervals("c", ignoring, 40)  # acts until the end: its deadline ignored
    assert double_owned(acts, -math.inf, math.inf) == {0: 4.0}  # 12-14 a+b, 14-16 b+c


async def paused_agent(s3_server: S3Server, bucket: str, workdir: Path,
                       app_args: tuple[str, ...]) -> dict[str, Any]:
    shards = 6
    fleet = Fleet(workdir, s3_server.url(bucket, "validity"), f"file://{workdir / 'leases'}",
                  shards)
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        names = ["n1", "n2", "n3"]
        for name in names:
            fleet.start_app(name, *app_args)
        await fleet.apps_serving(http)
        for name in names:
            fleet.start_node(name)
        before = await wait_for("3 nodes balanced, each shard open on its owner's app",
                                lambda: fleet.settled(http), describe=fleet.describe)

        victim = next(o["owner"] for o in before)
        taken = {o["shard"]: o["generation"] for o in before if o["owner"] == victim}
        paused_at = time.monotonic()
        fleet.pause(victim)

        async def taken_over() -> Owners | None:
            fleet.check_alive()
            owners = await fleet.owners()
            views = await fleet.app_views(http)
            for o in owners:
                if o["shard"] in taken:
                    if o["owner"] in (None, victim) or o["generation"] <= taken[o["shard"]]:
                        return None
                    view = views[o["owner"]]["open"].get(str(o["shard"]))
                    if view is None or view["generation"] != o["generation"]:
                        return None
            return owners

        await wait_for(f"{victim}'s shards {sorted(taken)} opened elsewhere", taken_over,
                       describe=fleet.describe)
        await asyncio.sleep(fleet.ttl)  # a longer SIGSTOP phase (pacing, not a check)
        # At its end, the stale app (its agent still paused, nobody wrote to
        # it meanwhile) is asked to write to each shard it lost.
        probes = []
        for shard in sorted(taken):
            key = keys_of(shard, 1, shards, stem=f"probe-{shard}-")[0]
            async with http.put(f"{fleet.app_urls[victim]}/kv/{key}", data=b"stale") as resp:
                probes.append((resp.status, await resp.json()))
        resumed_at = time.monotonic()
        fleet.resume(victim)
        await wait_for("3 nodes balanced again after SIGCONT", lambda: fleet.settled(http),
                       describe=fleet.describe)
        histories = {}
        for name, url in fleet.app_urls.items():
            async with http.get(f"{url}/history") as resp:
                histories[name] = await resp.json()
        ended_at = time.monotonic()
        codes = fleet.terminate_nodes()
        assert set(codes.values()) == {0}, (codes, fleet.describe())
    finally:
        await http.close()
        fleet.cleanup()

    intervals = [a for name, h in histories.items()
                 for a in acting_intervals(name, h, ended_at)]
    return {"victim": victim, "taken": taken, "probes": probes, "intervals": intervals,
            "sigstop_phase": double_owned(intervals, paused_at, resumed_at),
            "whole_run": double_owned(intervals, -math.inf, math.inf),
            "paused_for": resumed_at - paused_at}


def report(kind: str, run: dict[str, Any]) -> dict[str, Any]:
    figures = {"app": kind, "taken": len(run["taken"]),
               "paused_s": round(run["paused_for"], 3),
               "double_owned_shard_s_sigstop_phase": round(sum(run["sigstop_phase"].values()), 3),
               "double_owned_shard_s_whole_run": round(sum(run["whole_run"].values()), 3),
               "probes": [status for status, _ in run["probes"]]}
    print("paused agent, live app:", json.dumps(figures, sort_keys=True))
    return figures


@pytest.mark.slow
async def test_a_paused_agents_app_stops_at_its_deadline(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    run = await paused_agent(s3_server, s3_bucket, tmp_path, ())
    report("keeps deadlines", run)
    # No two apps ever acted on one shard at once: the stale app's deadline
    # for each taken shard came before the new owner's open.
    assert run["whole_run"] == {}, run["whole_run"]
    for shard, generation in run["taken"].items():
        stale = [a for a in run["intervals"] if a.app == run["victim"] and a.shard == shard
                 and a.generation == generation]
        newer = [a for a in run["intervals"] if a.shard == shard and a.generation > generation]
        assert stale and newer
        assert max(a.end for a in stale) <= min(a.start for a in newer)
    # A write after its validity ended is refused by the app itself (421,
    # expired), without asking the storage.
    for status, body in run["probes"]:
        assert status == 421 and body.get("expired") is True, body


@pytest.mark.slow
async def test_a_paused_agents_app_that_ignores_validity_acts_beside_the_new_owner(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    """The comparison: what the deadline takes away."""
    run = await paused_agent(s3_server, s3_bucket, tmp_path, ("--ignore-validity",))
    report("ignores validity", run)
    assert set(run["sigstop_phase"]) == set(run["taken"]), run["sigstop_phase"]
    # Only its storage stops it: the probe is refused as fenced (409).
    for status, body in run["probes"]:
        assert status == 409 and body["error"] == "fenced", body
