"""Who owns each shard, read from the store in one listing (the `owners`
command, the demo and the bench share it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardlease.stores.base import LeaseStore


@dataclass(frozen=True)
class OwnerRow:
    shard: int
    owner: str | None
    generation: int


async def read_owners(store: LeaseStore, cluster: str, shards: int | None) -> tuple[
        list[OwnerRow], list[str]]:
    """One listing of the leases: a row per shard (0..N-1, N from `shards` or
    the highest shard seen + 1) and a line per corrupt record."""
    # An empty listing of a store that is not there would read as "no owners".
    await store.check_readable()
    leases = await store.list_leases(cluster)
    count = shards if shards is not None else (max(leases) + 1 if leases else 0)
    rows, problems = [], []
    for shard in range(count):
        stored = leases.get(shard)
        if stored is None:
            rows.append(OwnerRow(shard, None, 0))
        elif stored.record is None:
            problems.append(f"shard {shard}: corrupt lease record: {stored.error}")
            rows.append(OwnerRow(shard, None, stored.generation or 0))
        else:
            rows.append(OwnerRow(shard, stored.record.owner, stored.record.generation))
    return rows, problems


def owners_table(rows: Sequence[OwnerRow]) -> str:
    header = ("SHARD", "OWNER", "GENERATION")
    cells = [(str(r.shard), r.owner or "-", str(r.generation)) for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(3)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(3)).rstrip()
             for c in [header, *cells]]
    by_owner: dict[str | None, list[int]] = {}
    for r in rows:
        by_owner.setdefault(r.owner, []).append(r.shard)
    lines.append("")
    for owner in sorted(by_owner, key=lambda o: (o is None, o or "")):
        shards = by_owner[owner]
        lines.append(f"{owner or '(unowned)'}: {len(shards)} shard(s): "
                     + " ".join(map(str, shards)))
    return "\n".join(lines)
