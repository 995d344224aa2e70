"""Placement decisions: which shards a node gives up, claims and adopts in a round.

The rule of this module: it is a pure function of data. It reads no clock
(`View.now` is the caller's monotonic reading), does no I/O, no asyncio and no
logging, and knows nothing of stores, records, epochs or the runner: it
imports only the standard library. The loop judges the records (which shards
are claimable at all, for how long each has been free) and carries out the
plan; this module only decides, so each decision can be tested as a table.

A round's plan (`plan`):

1. the fair share, ceil(shards / live nodes); 0 while stopping;
2. release the held shards at or above the shard count (it shrank), then the
   held shards above the share, cheapest first: not yet opened (nothing to
   close), then the ones claimed last (a node above its share holds shards
   it took while their node was away: back from a restart, that node gets
   its own shards back, with their caches or the data on its volume, and a
   rolling restart ends where it began), then the ones this node likes least
   (so it keeps the ones it would claim), adopted ones last (a peer's host
   may have refused them); at most
   `max_moves` of the latter per round, if set (`maxMovesPerRound`: a large
   scale change spread over rounds); never one claimed blind whose open its
   host has not answered (`Held.blind`), but by a stop;
3. claim the shards kept for this node by name (a pod back from a restart
   under `handoff: hold`), all of them in its first intervals (`returning`),
   within the share after; then up to the share among the
   other candidates, the ones this node prefers first (rendezvous hashing:
   each node prefers different shards, so concurrent claimers rarely race
   for the same lease and placements stay put), skipping those cooling down
   after a failed open here;
4. adopt, even above the share, a candidate nobody claimed for a whole TTL:
   the hosts of the nodes below their share may refuse it.

The constants, and why each has its value:

- COOLDOWN_FIRST, COOLDOWN_MAX: the cooldown of a shard this node failed to
  open, before it claims it again, doubles from COOLDOWN_FIRST * lease_ttl up
  to COOLDOWN_MAX * lease_ttl, times a jitter in [1, 1.5). The first is longer
  than a TTL and an interval, so a peer sees the shard free for a whole TTL
  and may adopt it first.
- COOLDOWN_WAIVED: ...unless the shard has stayed free this many TTLs (no
  peer adopted it: perhaps every host failed it for a while), so a transient
  failure everywhere delays the shard by that much at most. Nor is there a
  cooldown for a node that sees no live peer: alone, there is nobody to
  leave the shard to, and waiting only keeps it closed.
- ADOPT_PER_ROUND: how many shards free for longer than a TTL a node claims
  above its share per round. (loop.py's comment says what it counts, not why
  it is one.)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ADOPT_PER_ROUND",
    "COOLDOWN_FIRST",
    "COOLDOWN_MAX",
    "COOLDOWN_WAIVED",
    "Candidate",
    "Held",
    "Plan",
    "View",
    "cooldown",
    "failures_after",
    "fair_share",
    "plan",
    "preference",
    "releases_beyond",
]

#: First cooldown after a failed open, in lease TTLs (doubling from there).
COOLDOWN_FIRST = 2.0
#: Longest cooldown, in lease TTLs (before the jitter).
COOLDOWN_MAX = 8.0
#: A cooling shard free for longer than this many TTLs is claimed all the same.
COOLDOWN_WAIVED = 2.0
#: Shards free for longer than a TTL that a node claims above its share per round.
ADOPT_PER_ROUND = 1
#: Eligible shards beyond the claims a round may fall back on after lost races.
SPARES = 4

# Past this many doublings the cooldown is at its cap whatever COOLDOWN_FIRST is
# (2**64 times anything sensible exceeds COOLDOWN_MAX); bounding the exponent
# keeps `2.0 ** n` from overflowing a float after ~1024 failures.
_MAX_DOUBLINGS = 64


def preference(node: str, shard: int) -> int:
    """Rendezvous score: each node prefers different shards, so concurrent
    claimers rarely race for the same lease and placements stay put."""
    digest = hashlib.blake2b(f"{node}\0{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def fair_share(shards: int, live: int, *, stopping: bool) -> int:
    """The shards a node should hold: ceil(shards / live nodes), counting at
    least one live node (this one); 0 while stopping (it gives up everything)."""
    if stopping:
        return 0
    return math.ceil(shards / max(1, live))


@dataclass(frozen=True, kw_only=True, slots=True)
class Held:
    """A lease this node holds, as placement sees it."""

    shard: int
    #: Held and kept (the loop's Phase.HELD): not being released, not closed.
    active: bool
    #: The runner has started opening it (its state is neither WAITING nor none).
    opened: bool
    #: Claimed above the share (it was free for longer than a TTL).
    adopted: bool
    #: The round of this node that claimed it: of the shards above the
    #: share, the newest go first.
    claimed_in: int = 0
    #: Claimed blind (no generation of it known) and its open not answered
    #: yet: not released above the share, only by a stop. Its free would
    #: hand the shard on as though its generation were known to be new,
    #: where only the host's answer says so (regressions seed-123095345,
    #: seed-1851953618: freed before its open, claimed again one higher,
    #: opened beside the owner whose record had been deleted).
    blind: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A shard this node does not hold and the runner does not have, whose
    record the caller judged claimable (free, expired, or its epoch over)."""

    shard: int
    #: Seconds this node has seen it free (no record, or one naming no owner)
    #: without a change; 0 if it is not free (an owner's record, expired or
    #: not, or a corrupt one).
    free_for: float
    #: End of this node's cooldown after a failed open (monotonic); None: none.
    cooling_until: float | None
    #: Kept for this node by name (its pod replaced under `handoff: hold`):
    #: claimed first, whatever the share and any cooldown.
    reserved: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class View:
    """What a node knows at the start of a round's placement."""

    #: This node's name (the rendezvous hashes are keyed by it).
    node: str
    #: The cluster's shard count.
    shards: int
    #: Live nodes, this one included unless it is stopping.
    live: int
    stopping: bool
    #: The caller's monotonic clock, the timebase of `Candidate.cooling_until`.
    now: float
    #: The lease TTL, seconds.
    ttl: float
    #: Every lease this node holds, in any phase.
    held: tuple[Held, ...]
    #: Only shards whose record is claimable: the caller judges the records.
    #: A node at its share (no shard to claim) only ever adopts free shards,
    #: so the caller may then pass the free ones only and spare itself the
    #: O(shards) judgement; the plan is the same.
    candidates: tuple[Candidate, ...]
    #: Releases above the share per round, at most (None: no cap). Not the
    #: shards beyond the count, nor a stop's: those must go.
    max_moves: int | None = None
    #: The node just started (its first intervals): the shards kept for it
    #: are claimed whatever the share. Later, only within it (a reservation
    #: left behind must never make a node claim above its share round after
    #: round, releasing what it claimed the round before).
    returning: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A round's decisions."""

    share: int
    #: Held active shards to give up, in order: those beyond the shard count
    #: (`releases_beyond`), then the excess above the share, cheapest first.
    release: tuple[int, ...]
    #: Shards to claim up to the share, the most preferred first.
    claim: tuple[int, ...]
    #: Shards to claim above the share: free for longer than a TTL,
    #: ADOPT_PER_ROUND at most.
    adopt: tuple[int, ...]
    #: The other eligible shards, the most preferred first (SPARES at most):
    #: a claim that loses its race to a peer (peers see the same silence at
    #: the same time) is followed by the next of these in the same round.
    spare: tuple[int, ...] = ()


def releases_beyond(held: Iterable[Held], shards: int) -> tuple[int, ...]:
    """The held active shards at or above the shard count (it shrank, or a
    claim in flight when it did landed since), in the order given."""
    return tuple(h.shard for h in held if h.active and h.shard >= shards)


def plan(view: View) -> Plan:
    """The round's plan for `view`: see the module's docstring."""
    share = fair_share(view.shards, view.live, stopping=view.stopping)
    beyond = releases_beyond(view.held, view.shards)
    keep = [h for h in view.held if h.active and h.shard < view.shards]
    excess = _excess(view.node, keep, share, stopping=view.stopping)
    if view.max_moves is not None and not view.stopping:
        # (The rest goes in the next rounds; meanwhile this node claims
        # nothing, being above its share.)
        excess = excess[:view.max_moves]
    release = beyond + excess
    if view.stopping:
        return Plan(share=share, release=release, claim=(), adopt=())
    # Shards kept for this node (its reservations) come back to it first,
    # all of them: left alone they would wait out their hold elsewhere. Any
    # excess goes by the next rounds' releases, like any above the share.
    reserved = tuple(sorted(c.shard for c in view.candidates if c.reserved))
    if not view.returning:
        reserved = reserved[:max(0, share - len(keep))]
    want = max(0, share - len(keep) - len(reserved))  # (0 when there was an excess)
    alone = view.live <= 1
    waived = COOLDOWN_WAIVED * view.ttl
    eligible = [c for c in view.candidates if c.shard not in reserved and (
                c.cooling_until is None or view.now >= c.cooling_until
                or alone or c.free_for > waived)]
    eligible.sort(key=lambda c: preference(view.node, c.shard), reverse=True)
    claim = reserved + tuple(c.shard for c in eligible[:want])
    orphans = [c.shard for c in eligible[want:] if c.free_for > view.ttl]
    adopt = tuple(orphans[:ADOPT_PER_ROUND])
    spare = tuple(c.shard for c in eligible[want:] if c.shard not in adopt)[:SPARES] \
        if want else ()
    return Plan(share=share, release=release, claim=claim, adopt=adopt, spare=spare)


def _excess(node: str, keep: list[Held], share: int, *,
            stopping: bool = False) -> tuple[int, ...]:
    """The held shards above the share to release, cheapest first; none
    claimed blind and not yet answered, but by a stop (they go in a later
    round, once their host answered)."""
    excess = len(keep) - share
    if excess <= 0:
        return ()
    if not stopping:
        keep = [h for h in keep if not h.blind]

    def cost(h: Held) -> tuple[bool, bool, int, int]:
        return (h.adopted, h.opened, -h.claimed_in, preference(node, h.shard))

    return tuple(h.shard for h in sorted(keep, key=cost)[:excess])


def failures_after(previous: int | None, *, failed: bool, outdated: bool) -> int | None:
    """The failed opens in a row a close leaves on a shard (None: none, the
    shard is not cooled), from the count before it. An open refused as
    outdated is claimed again above the host's generation (another open), so
    the first in a row counts 0: no cooldown of a failing host, only the TTL
    during which the node that opened that generation may still hold it
    (`view.LeaseView.refused`); from the second on, the host is failing like
    any other. Any other close clears the count."""
    if outdated and previous is None:
        return 0
    if not (failed or outdated):
        return None
    return (previous or 0) + 1


def cooldown(failures: int, ttl: float, jitter: float) -> float:
    """Seconds a shard this node failed to open `failures` times in a row is
    left alone: COOLDOWN_FIRST TTLs, doubling with each failure, at most
    COOLDOWN_MAX TTLs, times `jitter` (the caller draws it from [1, 1.5))."""
    if failures < 1:
        raise ValueError(f"a cooldown follows at least one failure, not {failures}")
    doublings = min(failures - 1, _MAX_DOUBLINGS)
    return min(COOLDOWN_FIRST * 2.0**doublings, COOLDOWN_MAX) * ttl * jitter
