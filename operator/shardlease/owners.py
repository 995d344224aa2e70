"""Who owns each shard, read from the store in one listing (the `owners`
command, the demo and the bench share it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from shardlease.stores.base import LeaseStore, ended_hints


@dataclass(frozen=True)
class OwnerRow:
    shard: int
    owner: str | None
    generation: int
    #: Wall-clock seconds since this owner (or none) has had the shard; 0 if unknown.
    since: float = 0.0
    #: Whether the owner has a heartbeat record (None: not read). A one-shot
    #: read cannot tell a live node from a dead one (that takes a TTL of
    #: watching); a node with no heartbeat at all has stopped or never ran.
    heartbeat: bool | None = None
    #: How the owner keeps the lease ("shard" or "node"); None when unowned.
    renewal: str | None = None


async def read_owners(store: LeaseStore, cluster: str, shards: int | None,
                      heartbeats: bool = False) -> tuple[list[OwnerRow], list[str]]:
    """One listing of the leases (and, if asked, of the heartbeats): a row per
    shard (0..N-1, N from `shards` or the highest shard seen + 1) and a line
    per corrupt record."""
    # An empty listing of a store that is not there would read as "no owners".
    await store.check_readable()
    leases = await store.list_leases(cluster)
    # A node-mode lease whose epoch its owner ended (a graceful stop) is free:
    # the listing of the epochs says which are ended.
    by_epoch = any(st.record is not None and st.record.renewal == "node" and st.record.owner
                   for st in leases.values())
    epochs = await store.list_epochs(cluster) if heartbeats or by_epoch else {}
    ended = ended_hints(epochs)
    beating = None
    if heartbeats:
        # A node-mode node's epoch record is its heartbeat.
        beating = set(await store.list_heartbeats(cluster)) \
            | {node for node, epoch in epochs if (node, epoch) not in ended}
    count = shards if shards is not None else (max(leases) + 1 if leases else 0)
    rows, problems = [], []
    for shard in range(count):
        stored = leases.get(shard)
        if stored is None:
            rows.append(OwnerRow(shard, None, 0))
        elif stored.record is None:
            problems.append(f"shard {shard}: corrupt lease record: {stored.error}")
            rows.append(OwnerRow(shard, None, stored.generation or 0))
        elif stored.record.renewal == "node" and stored.record.owner is not None \
                and (stored.record.owner, stored.record.incarnation or "") in ended:
            rows.append(OwnerRow(shard, None, stored.record.generation))
        else:
            rec = stored.record
            rows.append(OwnerRow(shard, rec.owner, rec.generation, rec.since,
                                 None if beating is None or rec.owner is None
                                 else rec.owner in beating,
                                 rec.renewal if rec.owner is not None else None))
    return rows, problems


def age(since: float, now: float) -> str:
    """'42s', '7m', '3h', '2d' ago; '-' when unknown."""
    if since <= 0:
        return "-"
    s = max(0, int(now - since))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else \
        f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


NO_HEARTBEAT = ("* no heartbeat from this owner: it stopped, or it never ran as a node "
                "(its leases are taken over once they expire)")


def owners_table(rows: Sequence[OwnerRow], now: float | None = None,
                 mark_note: str = NO_HEARTBEAT) -> str:
    """SHARD, OWNER (`*` when it has no heartbeat), GENERATION, SINCE, then
    a line per owner. The kubectl plugin draws the same table."""
    now = time.time() if now is None else now
    header = ("SHARD", "OWNER", "GENERATION", "SINCE")
    cells = [(str(r.shard), (r.owner or "-") + (" *" if r.heartbeat is False else ""),
              str(r.generation), age(r.since, now)) for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(header))).rstrip()
             for c in [header, *cells]]
    by_owner: dict[str | None, list[int]] = {}
    for r in rows:
        by_owner.setdefault(r.owner, []).append(r.shard)
    lines.append("")
    for owner in sorted(by_owner, key=lambda o: (o is None, o or "")):
        shards = by_owner[owner]
        lines.append(f"{owner or '(unowned)'}: {len(shards)} shard(s): "
                     + " ".join(map(str, shards)))
    if any(r.heartbeat is False for r in rows):
        lines.append(mark_note)
    return "\n".join(lines)
