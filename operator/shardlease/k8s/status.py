"""The ShardSet status: who owns what, as one pod sees it.

One writer publishes: the pod that holds shard 0. It publishes when the
content changed, and never more than once per interval, so a thousand-shard
set costs the API server one write per change, not one per pod per round;
and at least every REFRESH_INTERVALS intervals, to move `observedTime`. A
status whose `observedTime` is older than STALE_INTERVALS intervals was
published by nobody alive: the operator then marks it Balanced=Unknown, so
that `kubectl wait --for=condition=Balanced` cannot be fooled by the last
words of agents that have all stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from shardlease.view import Owner

logger = logging.getLogger("shardlease.status")

PUBLISHED = ("Balanced", "Degraded")
REFRESH_INTERVALS = 2
STALE_INTERVALS = 6


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: The highest generation a status may publish: 2^53 - 1, the largest integer
#: every JSON reader keeps exactly (and far below int64, where applications
#: keep the token). One above it, written by anyone who may write the status,
#: would push every claim past what the application can compare.
MAX_PUBLISHED = 2**53 - 1


def published_generations(status: Mapping[str, Any] | None) -> dict[int, int]:
    """The highest generation a status tells per shard (`highestGenerations`,
    and the owners' `generations`), entries that are not a shard number and a
    positive integer left out (a status anyone with the right may have
    written is input like any other), and reported and left out above
    MAX_PUBLISHED."""
    out: dict[int, int] = {}
    for field in ("generations", "highestGenerations"):
        table = (status or {}).get(field)
        if not isinstance(table, Mapping):
            continue
        for key, value in table.items():
            try:
                shard = int(key)
            except (TypeError, ValueError):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or shard < 0:
                continue
            if value > MAX_PUBLISHED:
                logger.warning("the status's %s says generation %d for shard %d, above "
                               "2^53 - 1: ignored", field, value, shard)
                continue
            out[shard] = max(value, out.get(shard, 0))
    return out


def highest(*tables: Mapping[int, int]) -> dict[int, int]:
    """Per shard, the highest generation in any of `tables`."""
    out: dict[int, int] = {}
    for table in tables:
        for shard, generation in table.items():
            out[shard] = max(generation, out.get(shard, 0))
    return out


def build_status(owners: Iterable[Owner], live_nodes: Iterable[str], shards: int,
                 observed_generation: int | None, publisher: str,
                 highest_generations: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The status fields (without transition times) for the owners read last.
    `highest_generations`: what has been handed out per shard, owned or not,
    in this store or one before it (published so that a new store's claims,
    or a claim over a lost record, go above it)."""
    owners = list(owners)
    owned = {o.shard: o for o in owners if o.owner is not None and 0 <= o.shard < shards}
    reserved = {o.shard: o.reserved_for for o in owners
                if o.owner is None and o.reserved_for is not None and 0 <= o.shard < shards}
    owner_of = {s: o.owner for s, o in owned.items() if o.owner is not None}
    live = sorted(set(live_nodes))
    share = math.ceil(shards / len(live)) if live else shards
    per_node = Counter(owner_of.values())
    unowned = shards - len(owned)
    over = {n: c for n, c in per_node.items() if c > share}
    strangers = sorted(set(per_node) - set(live))
    if unowned:
        balanced = ("False", "UnownedShards", f"{unowned} of {shards} shard(s) have no owner")
    elif over:
        balanced = ("False", "OverShare", "above the fair share of "
                    f"{share}: " + ", ".join(f"{n} holds {c}" for n, c in sorted(over.items())))
    elif strangers:
        balanced = ("False", "OwnersNotLive", "owners not seen live: " + ", ".join(strangers))
    else:
        balanced = ("True", "FairShares",
                    f"{shards} shard(s) across {len(live)} live pod(s), at most {share} each")
    degraded = ("True", "UnownedShards", balanced[2]) if unowned else (
        "False", "AllShardsOwned", f"all {shards} shard(s) have an owner")
    status: dict[str, Any] = {
        "owners": {str(s): owner for s, owner in sorted(owner_of.items())},
        "generations": {str(s): o.generation for s, o in sorted(owned.items())},
        # When each owner took its shard (from the lease records; informational).
        "since": {str(s): iso(o.since) for s, o in sorted(owned.items()) if o.since > 0},
        "highestGenerations": {str(s): g for s, g in sorted(
            highest(highest_generations or {},
                    {o.shard: o.generation for o in owned.values()}).items())
            if 0 <= s < shards},
        # Unowned shards kept for a pod being replaced (handoff: hold).
        "reserved": {str(s): pod for s, pod in sorted(reserved.items())},
        "ownedShards": len(owned),
        "liveNodes": len(live),
        "nodes": live,
        "publishedBy": publisher,
        "observedTime": now_iso(),
        "conditions": [
            {"type": "Balanced", "status": balanced[0], "reason": balanced[1],
             "message": balanced[2]},
            {"type": "Degraded", "status": degraded[0], "reason": degraded[1],
             "message": degraded[2]},
        ],
    }
    if observed_generation is not None:
        status["observedGeneration"] = observed_generation
    return status


def merge_conditions(new: list[dict[str, Any]], old: list[dict[str, Any]] | None,
                     generation: int | None) -> list[dict[str, Any]]:
    """Conditions in the Kubernetes convention: lastTransitionTime moves only
    when the status flips; conditions of other writers are kept."""
    old = old or []
    by_type = {c.get("type"): c for c in old}
    out = []
    for cond in new:
        prev = by_type.get(cond["type"])
        cond = dict(cond)
        same = prev is not None and prev.get("status") == cond["status"]
        cond["lastTransitionTime"] = prev.get("lastTransitionTime") if same and prev \
            else now_iso()
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    types = {c["type"] for c in new}
    out.extend(c for c in old if c.get("type") not in types)
    return out


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """A status without the fields that change on every write."""
    out = dict(status)
    out.pop("observedTime", None)
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in status.get("conditions") or []]
    return out


def interval_of(spec: dict[str, Any]) -> float:
    """The loop's interval from a ShardSet spec (wire form)."""
    interval = spec.get("interval")
    return float(interval) if interval else float(spec.get("leaseTTL") or 15.0) / 3


def stale_for(status: dict[str, Any], interval: float, now: dt.datetime) -> float | None:
    """Seconds by which `observedTime` is past STALE_INTERVALS intervals, or
    None if it is fresh or absent (a status from before observedTime existed
    cannot be judged). Compares wall clocks of two machines: skew of a few
    seconds only moves the verdict by as much, against a limit of 30 s by
    default."""
    raw = status.get("observedTime")
    if not isinstance(raw, str):
        return None
    try:
        seen = dt.datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    age = (now - seen).total_seconds()
    return age if age > STALE_INTERVALS * interval else None
