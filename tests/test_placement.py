"""Placement decisions as tables: shares, releases, claims, adoptions, cooldowns.

Preference orders are computed here from `preference` itself (never typed in),
so each expected tuple states the rule, and the cases that rely on an order
check first that the shards involved do differ in preference."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace

import pytest

from shardlease.placement import (
    ADOPT_PER_ROUND,
    COOLDOWN_FIRST,
    COOLDOWN_MAX,
    COOLDOWN_WAIVED,
    SPARES,
    Candidate,
    Held,
    Plan,
    View,
    cooldown,
    failures_after,
    fair_share,
    plan,
    preference,
    releases_beyond,
)

NODE = "node-a"
TTL = 15.0
NOW = 1000.0


def by_preference(shards: Iterable[int], node: str = NODE) -> tuple[int, ...]:
    """`shards`, the most preferred by `node` first."""
    return tuple(sorted(shards, key=lambda s: preference(node, s), reverse=True))


def least_first(shards: list[int], node: str = NODE) -> tuple[int, ...]:
    return tuple(reversed(by_preference(shards, node)))


def held(shard: int, *, active: bool = True, opened: bool = True,
         adopted: bool = False, claimed_in: int = 0, blind: bool = False) -> Held:
    return Held(shard=shard, active=active, opened=opened, adopted=adopted,
                claimed_in=claimed_in, blind=blind)


def free(shard: int, free_for: float = 0.0, cooling_until: float | None = None) -> Candidate:
    return Candidate(shard=shard, free_for=free_for, cooling_until=cooling_until)


def view(*, shards: int = 8, live: int = 2, stopping: bool = False,
         held: tuple[Held, ...] = (), candidates: tuple[Candidate, ...] = ()) -> View:
    return View(node=NODE, shards=shards, live=live, stopping=stopping, now=NOW, ttl=TTL,
                held=held, candidates=candidates)


# -- the share ------------------------------------------------------------------------


@pytest.mark.parametrize(("shards", "live", "stopping", "share"), [
    (8, 0, False, 8),
    (8, 1, False, 8),
    (8, 2, False, 4),
    (10, 3, False, 4),
    (2, 5, False, 1),
    (8, 2, True, 0),
    (8, 0, True, 0),
], ids=[
    "no live node counted is counted as one, this node: it takes every shard",
    "alone, a node takes every shard",
    "an even division gives each node its part",
    "an uneven division rounds up",
    "more nodes than shards still gives each node one",
    "a stopping node's share is 0",
    "a stopping node that sees nobody still has share 0",
])
def test_fair_share(shards: int, live: int, stopping: bool, share: int) -> None:
    assert fair_share(shards, live, stopping=stopping) == share
    assert plan(view(shards=shards, live=live, stopping=stopping)).share == share


# -- releases -------------------------------------------------------------------------


def _release_cases() -> list[tuple[View, tuple[int, ...]]]:
    four = [0, 1, 2, 3]
    cases = [
        # share 4 (8 shards, 2 live): 4 held, nothing to release.
        (view(held=tuple(held(s) for s in four)), ()),
        # share 4, 4 active and 2 already releasing: nothing more to release.
        (view(held=(*(held(s) for s in four), held(4, active=False), held(5, active=False))),
         ()),
        # share 2 (8 shards, 4 live): the two least preferred of four go.
        (view(live=4, held=tuple(held(s) for s in four)), least_first(four)[:2]),
        # share 2: the one not yet opened goes first, whatever its preference.
        (view(live=4, held=(held(0), held(1), held(2, opened=False))),
         (2,)),
        # share 2: the adopted one stays, though not opened: the least preferred
        # of the others goes.
        (view(live=4, held=(held(0, adopted=True, opened=False), held(1), held(2))),
         least_first([1, 2])[:1]),
        # share 1 (8 shards, 8 live): not opened first, then opened, adopted last.
        (view(live=8, held=(held(0, adopted=True), held(1), held(2, opened=False))),
         (2, 1)),
        # share 0 while stopping: everything active, in the same order.
        (view(stopping=True, held=(held(0, adopted=True), held(1), held(2, opened=False),
                                   held(3, active=False))),
         (2, 1, 0)),
        # shard count shrank to 3: shard 5 goes first, then the excess among the rest
        # (share 3 with 1 live: the 3 shards below 3 stay).
        (view(shards=3, live=1, held=(held(5), held(0), held(1), held(2))), (5,)),
        # shrank to 4 with 2 live (share 2): 6 goes, then the least preferred of 0..2.
        (view(shards=4, held=(held(6), held(0), held(1), held(2))),
         (6, *least_first([0, 1, 2])[:1])),
        # share 2: of four opened, the two claimed last go, whatever the
        # preference (taken while their node was away: it is back).
        (view(live=4, held=(held(0), held(1, claimed_in=9), held(2), held(3, claimed_in=7))),
         (1, 3)),
        # share 2: claimed in the same round, the least preferred of those goes.
        (view(live=4, held=(held(0), held(1, claimed_in=9), held(2, claimed_in=9))),
         least_first([1, 2])[:1]),
        # share 2: not opened goes before a newer opened one; adopted stay, however new.
        (view(live=4, held=(held(0, claimed_in=1), held(1, claimed_in=9),
                            held(2, opened=False), held(3, adopted=True, claimed_in=12))),
         (2, 1)),
        # share 2: a blind claim not yet answered stays, though it is the
        # cheapest (not opened); the least preferred opened one goes instead.
        (view(live=4, held=(held(0), held(1), held(2, opened=False, blind=True))),
         least_first([0, 1])[:1]),
        # share 1: two above the share, but one is blind: only the other goes
        # this round (the blind one in a later round, once answered).
        (view(live=8, held=(held(0), held(1, opened=False, blind=True))), (0,)),
        # share 1: every shard blind: nothing goes this round.
        (view(live=8, held=(held(0, blind=True), held(1, opened=False, blind=True))), ()),
        # share 0 while stopping: blind ones go too (their free waits as a
        # refusal's: keeper.Held.blind).
        (view(stopping=True, held=(held(0), held(1, opened=False, blind=True))),
         (1, 0)),
    ]
    return cases


@pytest.mark.parametrize(("v", "release"), _release_cases(), ids=[
    "nothing is released at the share",
    "shards already releasing do not count against the share",
    "above the share the least preferred shards are released",
    "a shard not yet opened is released before opened ones",
    "adopted shards are released last, even when not opened",
    "the order is not-opened, then opened, then adopted",
    "a stopping node releases every active shard, adopted last",
    "shards beyond a shrunk shard count are released and not counted in the share",
    "shards beyond the count go first, then the excess among the rest",
    "above the share the shards claimed last are released first",
    "claimed in one round, the least preferred of them goes first",
    "not opened, then claimed last, then adopted",
    "a blind claim whose open is not answered is not released above the share",
    "above the share with a blind claim, only the others go",
    "above the share with only blind claims, nothing goes",
    "a stopping node releases blind claims too",
])
def test_release(v: View, release: tuple[int, ...]) -> None:
    # The cases that rely on preference order need distinct scores.
    assert len({preference(NODE, h.shard) for h in v.held}) == len(v.held)
    assert plan(v).release == release


def test_releases_beyond_lists_active_shards_at_or_above_the_count_in_order() -> None:
    hs = (held(9), held(3), held(4, active=False), held(5), held(1))
    assert releases_beyond(hs, 4) == (9, 5)
    assert releases_beyond(hs, 10) == ()


# -- claims and adoptions -------------------------------------------------------------

COOLING = NOW + 5.0  # a cooldown still running at NOW
COOLED = NOW  # a cooldown that ended at NOW (now >= until: over)
ORPHAN = TTL + 0.1  # free for just over a TTL
WAIVED = COOLDOWN_WAIVED * TTL


def _claim_cases() -> list[tuple[View, tuple[int, ...], tuple[int, ...]]]:
    six = [0, 1, 2, 3, 4, 5]
    best = by_preference(six)
    return [
        # share 4, nothing held: the 4 most preferred of 6.
        (view(candidates=tuple(free(s) for s in six)), best[:4], ()),
        # share 4, 2 held: want 2.
        (view(held=(held(6), held(7)), candidates=tuple(free(s) for s in six)), best[:2], ()),
        # share 4, 3 held and 1 releasing: the releasing one does not count, want 1.
        (view(held=(held(6), held(7), held(8, active=False), held(9)),
              shards=12, live=3, candidates=tuple(free(s) for s in six)),
         best[:1], ()),
        # share 4, 4 held: want 0, nothing free for over a TTL: nothing.
        (view(held=tuple(held(s) for s in (6, 7, 8, 9)), shards=16, live=4,
              candidates=tuple(free(s, free_for=TTL) for s in six)),
         (), ()),
        # want 2: the most preferred is cooling down, so the next two.
        (view(held=(held(6), held(7)),
              candidates=(*(free(s) for s in six if s != best[0]),
                          free(best[0], cooling_until=COOLING))),
         best[1:3], ()),
        # a cooldown that ended (now >= until) no longer counts.
        (view(held=(held(6), held(7)),
              candidates=(*(free(s) for s in six if s != best[0]),
                          free(best[0], cooling_until=COOLED))),
         best[:2], ()),
        # alone (1 live): a cooling shard is claimed all the same.
        (view(live=1, shards=8, held=(held(6), held(7)),
              candidates=(free(best[0], cooling_until=COOLING),)),
         (best[0],), ()),
        # free for more than COOLDOWN_WAIVED TTLs: claimed all the same.
        (view(held=(held(6), held(7)),
              candidates=(free(best[0], free_for=WAIVED + 0.1, cooling_until=COOLING),)),
         (best[0],), ()),
        # free for exactly COOLDOWN_WAIVED TTLs: still cooling.
        (view(held=(held(6), held(7)),
              candidates=(free(best[0], free_for=WAIVED, cooling_until=COOLING),)),
         (), ()),
        # at the share: a shard free for over a TTL is adopted.
        (view(held=tuple(held(s) for s in (6, 7, 8, 9)), shards=16, live=4,
              candidates=(free(0, free_for=ORPHAN),)),
         (), (0,)),
        # at the share: free for exactly a TTL is not adopted.
        (view(held=tuple(held(s) for s in (6, 7, 8, 9)), shards=16, live=4,
              candidates=(free(0, free_for=TTL),)),
         (), ()),
        # at the share: of three orphans, the most preferred ADOPT_PER_ROUND.
        (view(held=tuple(held(s) for s in (6, 7, 8, 9)), shards=16, live=4,
              candidates=tuple(free(s, free_for=ORPHAN) for s in (0, 1, 2))),
         (), by_preference([0, 1, 2])[:ADOPT_PER_ROUND]),
        # below the share: claims first, then an orphan among the rest is adopted.
        (view(shards=12, live=3, held=(held(6), held(7), held(8)),
              candidates=tuple(free(s, free_for=ORPHAN) for s in six)),
         best[:1], best[1:1 + ADOPT_PER_ROUND]),
        # below the share: the rest holds no orphan (free, but not for a TTL).
        (view(shards=12, live=3, held=(held(6), held(7), held(8)),
              candidates=(*(free(s) for s in best[1:]), free(best[0], free_for=ORPHAN))),
         best[:1], ()),
        # a cooling orphan is not adopted either.
        (view(held=tuple(held(s) for s in (6, 7, 8, 9)), shards=16, live=4,
              candidates=(free(0, free_for=ORPHAN, cooling_until=COOLING),)),
         (), ()),
        # above the share (releasing): no claim, but an orphan is still adopted.
        (view(live=4, held=tuple(held(s) for s in (6, 7, 8)),
              candidates=(free(0, free_for=ORPHAN),)),
         (), (0,)),
        # stopping: neither claims nor adoptions.
        (view(stopping=True, candidates=tuple(free(s, free_for=WAIVED + 1) for s in six)),
         (), ()),
    ]


@pytest.mark.parametrize(("v", "claim", "adopt"), _claim_cases(), ids=[
    "with nothing held a node claims its share, the most preferred first",
    "a node claims only what it lacks of its share",
    "a shard being released does not count as held",
    "at its share a node claims nothing free for a TTL or less",
    "a shard cooling down is skipped for the next preferred",
    "a cooldown that has ended no longer skips the shard",
    "a node alone claims a shard cooling down",
    "a shard free for more than two TTLs is claimed though cooling down",
    "a shard free for exactly two TTLs still cools down",
    "at its share a node adopts a shard free for over a TTL",
    "a shard free for exactly a TTL is not adopted",
    "at most ADOPT_PER_ROUND orphans are adopted, the most preferred",
    "below its share a node claims, then adopts an orphan among the rest",
    "only a shard free for over a TTL is adopted after the claims",
    "a cooling orphan is not adopted",
    "a node above its share still adopts an orphan",
    "a stopping node neither claims nor adopts",
])
def test_claims(v: View, claim: tuple[int, ...], adopt: tuple[int, ...]) -> None:
    assert len({preference(NODE, c.shard) for c in v.candidates}) == len(v.candidates)
    p = plan(v)
    assert (p.claim, p.adopt) == (claim, adopt)


def test_the_order_of_the_candidates_given_does_not_matter() -> None:
    cs = tuple(free(s, free_for=ORPHAN) for s in range(8))
    v = view(live=4, candidates=cs)
    assert plan(v) == plan(replace(v, candidates=cs[::-1]))


def test_a_whole_plan() -> None:
    # 8 shards, 2 live: share 4; 5 held (one beyond a shrunk count of 8), so
    # after releasing shard 9 four remain: no excess, no claim, one adoption.
    v = view(held=(held(9), held(0), held(1), held(2), held(3)),
             candidates=(free(4, free_for=ORPHAN), free(5)))
    assert plan(v) == Plan(share=4, release=(9,), claim=(), adopt=(4,))


@pytest.mark.parametrize(("v", "spare"), [
    # share 4, 2 held, 6 eligible: 2 claims, the next 4 are the spares, in order.
    (view(held=(held(6), held(7)), candidates=tuple(free(s) for s in range(6))),
     by_preference(range(6))[2:6]),
    # 8 eligible: no more than SPARES of them.
    (view(shards=16, held=tuple(held(s) for s in range(8, 14)),
          candidates=tuple(free(s) for s in range(8))),
     by_preference(range(8))[2:2 + SPARES]),
    # a shard adopted is not also a spare.
    (view(shards=12, live=3, held=(held(6), held(7), held(8)),
          candidates=tuple(free(s, free_for=ORPHAN) for s in range(6))),
     by_preference(range(6))[1 + ADOPT_PER_ROUND:1 + ADOPT_PER_ROUND + SPARES]),
    # a cooling shard is no spare either.
    (view(held=(held(6), held(7)),
          candidates=(free(0), free(1), free(2, cooling_until=COOLING))), ()),
    # at the share: no claim to fall back from, no spares.
    (view(held=tuple(held(s) for s in (6, 7, 8, 9)), shards=16, live=4,
          candidates=tuple(free(s) for s in range(6))), ()),
    # stopping: none.
    (view(stopping=True, candidates=tuple(free(s) for s in range(6))), ()),
], ids=[
    "the eligible shards after the claims are the spares, the most preferred first",
    "at most SPARES spares",
    "an adopted shard is not a spare",
    "a cooling shard is not a spare",
    "a node at its share has no spares",
    "a stopping node has no spares",
])
def test_spares(v: View, spare: tuple[int, ...]) -> None:
    p = plan(v)
    assert p.spare == spare
    assert not set(p.spare) & (set(p.claim) | set(p.adopt))


# -- cooldowns ------------------------------------------------------------------------


@pytest.mark.parametrize(("failures", "jitter", "seconds"), [
    (1, 1.0, COOLDOWN_FIRST * TTL),
    (2, 1.0, 2 * COOLDOWN_FIRST * TTL),
    (3, 1.0, COOLDOWN_MAX * TTL),
    (4, 1.0, COOLDOWN_MAX * TTL),
    (1, 1.25, COOLDOWN_FIRST * TTL * 1.25),
    (10, 1.49, COOLDOWN_MAX * TTL * 1.49),
    (2000, 1.0, COOLDOWN_MAX * TTL),
], ids=[
    "the first cooldown is COOLDOWN_FIRST TTLs",
    "the second doubles it",
    "the third reaches the cap, COOLDOWN_MAX TTLs",
    "past the cap it grows no more",
    "the jitter multiplies the cooldown",
    "the jitter multiplies the capped cooldown too",
    "thousands of failures neither overflow nor pass the cap",
])
def test_cooldown(failures: int, jitter: float, seconds: float) -> None:
    assert cooldown(failures, TTL, jitter) == seconds


def test_the_constants_are_the_documented_ones() -> None:
    # The module's docstring says why each has its value.
    assert (COOLDOWN_FIRST, COOLDOWN_MAX, COOLDOWN_WAIVED, ADOPT_PER_ROUND) == (2.0, 8.0, 2.0, 1)


def test_cooldown_wants_a_failure() -> None:
    with pytest.raises(ValueError, match="at least one failure"):
        cooldown(0, TTL, 1.0)


# -- preference -----------------------------------------------------------------------


#: The scores of today's (and every earlier version's) rendezvous hash.
PINNED = (12467968906235101664, 3519345710643199738, 12969733725817536255,
          16982337024405671305, 18274246449543414504)


@pytest.mark.parametrize(("node", "shard", "score"), [
    ("node-a", 0, PINNED[0]), ("node-a", 1, PINNED[1]), ("node-b", 0, PINNED[2]),
    ("pod-7.shards", 4095, PINNED[3]), ("x", 123456, PINNED[4]),
], ids=[
    "node-a scores shard 0 as every version has",
    "node-a scores shard 1 as every version has",
    "node-b scores shard 0 as every version has",
    "a dotted pod name scores shard 4095 as every version has",
    "a one-letter node scores a large shard as every version has",
])
def test_preference_is_the_rendezvous_score_every_version_uses(
        node: str, shard: int, score: int) -> None:
    # A changed score would move shards on an upgrade for no reason: pinned.
    digest = hashlib.blake2b(f"{node}\0{shard}".encode(), digest_size=8).digest()
    assert preference(node, shard) == int.from_bytes(digest, "big") == score


def test_nodes_prefer_different_shards() -> None:
    shards = list(range(16))
    assert by_preference(shards, "node-a") != by_preference(shards, "node-b")


def test_shards_kept_for_this_node_are_claimed_first_all_of_them_whatever_the_share() -> None:
    kept = [Candidate(shard=s, free_for=0.0, cooling_until=NOW + 100, reserved=True)
            for s in (5, 1, 3)]
    others = tuple(free(s) for s in (0, 2, 4, 7))
    # Share 4 (8 shards, 2 live), one held: 3 to claim, all of them kept here
    # (their cooldown does not count either).
    p = plan(view(held=(held(6),), candidates=(*kept, *others)))
    assert p.claim == (1, 3, 5)
    # Above the share: claimed all the same (the rest would wait out their hold).
    p = plan(view(held=tuple(held(s) for s in (0, 2, 6)),
                  candidates=(*kept, free(4), free(7))))
    assert p.claim == (1, 3, 5) and p.adopt == () and 1 not in p.spare
    # And with room left, the preferred others follow.
    p = plan(view(live=1, candidates=(kept[0], *others)))
    assert p.claim == (5, *by_preference(s.shard for s in others)[:7])


def test_a_cap_on_moves_spreads_the_releases_above_the_share_over_rounds() -> None:
    mine = tuple(held(s) for s in range(8))
    # 8 held, share 2 (8 shards, 4 live): 6 to give up, 2 a round with the cap.
    assert len(plan(view(live=4, held=mine)).release) == 6
    capped = plan(replace(view(live=4, held=mine), max_moves=2))
    assert capped.release == plan(view(live=4, held=mine)).release[:2]
    assert capped.claim == ()
    # Not a stop's releases, nor those beyond a smaller shard count.
    assert len(plan(replace(view(live=4, held=mine, stopping=True), max_moves=2)).release) == 8
    beyond = plan(replace(view(shards=4, live=1, held=mine), max_moves=1))
    assert beyond.release == (4, 5, 6, 7)


def test_after_its_first_intervals_a_node_claims_what_is_kept_for_it_within_its_share() -> None:
    kept = tuple(Candidate(shard=s, free_for=0.0, cooling_until=None, reserved=True)
                 for s in (1, 3, 5))
    at_share = tuple(held(s) for s in (0, 2, 4, 6))  # share 4 (8 shards, 2 live)
    # Just back: all of them, above the share (the excess goes next round).
    assert plan(view(held=at_share, candidates=kept)).claim == (1, 3, 5)
    # Later (a reservation left behind): never above the share, so no node
    # claims and releases the same shards round after round.
    later = replace(view(held=at_share, candidates=kept), returning=False)
    assert plan(later).claim == ()
    below = replace(view(held=at_share[:2], candidates=(*kept, free(7))), returning=False)
    assert plan(below).claim == (1, 3)


@pytest.mark.parametrize(("previous", "failed", "outdated", "after"), [
    (None, True, False, 1),
    (2, True, False, 3),
    (None, False, True, 0),
    (0, False, True, 1),
    (1, False, True, 2),
    (0, True, False, 1),
    (None, False, False, None),
    (3, False, False, None),
], ids=[
    "a failed open: the first in a row",
    "...and the next",
    "refused as outdated: claimed again above, no cooldown of a failing host",
    "refused as outdated a second time in a row: cooled",
    "...and doubling from there",
    "a failed open after an outdated one counts on",
    "any other close: nothing to cool",
    "...and it clears the count",
])
def test_failed_opens_in_a_row(previous: int | None, failed: bool, outdated: bool,
                               after: int | None) -> None:
    assert failures_after(previous, failed=failed, outdated=outdated) == after
