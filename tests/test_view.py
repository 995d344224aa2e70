"""LeaseView.attribute as a table: a damaged lease record this node never saw
readable is judged by what the epoch records say they keep (finding H')."""

from __future__ import annotations

import random

import pytest

from shardlease.calls import Calls
from shardlease.clock import LoopClock
from shardlease.epochs import EpochWatch
from shardlease.records import Epoch, Lease, Stored, encode_shards
from shardlease.stores.memory import MemoryStore
from shardlease.telemetry import Telemetry
from shardlease.view import LeaseView

TTL = 15.0
DAMAGED: Stored[Lease] = Stored("v1", None, "not JSON", recovered_generation=4)


def make_view() -> LeaseView:
    clock = LoopClock()
    calls = Calls(interval=TTL / 3, ttl=TTL, clock=clock, rng=random.Random(0))
    watch = EpochWatch(MemoryStore(), calls, clock, Telemetry(), cluster="c", name="me",
                       ttl=lambda: TTL, own=lambda: "mine")
    return LeaseView(Telemetry(), watch, cluster="c", name="me", incarnation="mine",
                     own_epochs=lambda: {"mine"}, ttl=lambda: TTL)


def epoch(keeps: list[int] | str | None, ttl: float = TTL, node: str = "b") -> Epoch:
    return Epoch(cluster="c", node=node, epoch="e1", seq=3, write_id="w", ttl=ttl,
                 keeps=encode_shards(keeps) if isinstance(keeps, list) else keeps)


@pytest.mark.parametrize(("keepers", "now", "since", "claimable", "kept_by"), [
    (None, 20.0, 0.0, False, None),
    ([], 20.0, 0.0, True, None),
    ([epoch([1, 3])], 20.0, 0.0, True, None),
    ([epoch([1, 2, 3])], 20.0, 0.0, False, "b"),
    ([epoch([1]), epoch([2], node="c")], 20.0, 0.0, False, "c"),
    ([epoch(None)], 20.0, 0.0, False, "b"),
    ([epoch("A")], 20.0, 0.0, False, "b"),
    ([epoch([1], ttl=60.0)], 20.0, 0.0, False, None),
    ([epoch([1], ttl=60.0)], 61.0, 0.0, True, None),
    ([], 20.0, 10.0, False, None),
    ([], 26.0, 10.0, True, None),
], ids=[
    "epochs that could not be read: not claimable",
    "no epoch: claimable once seen unchanged for a TTL",
    "no epoch keeps it: claimable",
    "an epoch keeps it: its epoch's, left to it",
    "the epoch that keeps it, of several",
    "an epoch that says nothing may keep anything",
    "an epoch whose bitmap cannot be read may keep anything",
    "a keeper's longer TTL is waited for",
    "...and then claimable",
    "the wait counts from when the epoch listings started to succeed",
    "...and then claimable",
])
def test_a_damaged_record_never_seen_readable(
        keepers: list[Epoch] | None, now: float, since: float, claimable: bool,
        kept_by: str | None) -> None:
    view = make_view()
    leases = {2: DAMAGED}
    view.observe(leases, 4, 0.0, ())
    assert view.damaged == {2} and view.kept_by_epoch(2) is None
    view.attribute([2], leases, keepers, now, since=since)
    assert view.claimable(2, DAMAGED, now) is claimable
    kept = view.kept_by_epoch(2)
    assert (kept.owner if kept is not None else None) == kept_by
    if kept is not None:
        assert (kept.incarnation, kept.renewal, kept.generation) == ("e1", "node", 4)


def test_what_no_epoch_keeps_is_claimable_at_that_version_only() -> None:
    view = make_view()
    view.observe({2: DAMAGED}, 4, 0.0, ())
    view.attribute([2], {2: DAMAGED}, [], 20.0, since=0.0)
    again = Stored("v2", None, "garbage again")
    assert view.claimable(2, DAMAGED, 20.0)
    assert not view.claimable(2, again, 20.0)
    # ...and for one round: the next judgement starts afresh.
    view.attribute([2], {2: DAMAGED}, None, 25.0, since=0.0)
    assert not view.claimable(2, DAMAGED, 25.0)


def test_a_record_a_newer_format_holds_is_not_damaged() -> None:
    view = make_view()
    newer = Stored("v1", None, "format 2", newer_format=2)
    view.observe({2: newer, 3: DAMAGED}, 4, 0.0, ())
    assert view.damaged == {3}


def free_lease(reserved_for: str | None, hold: float, version: str = "v1") -> Stored[Lease]:
    return Stored(version, Lease(cluster="c", shard=2, owner=None, generation=3, write_id="w",
                                 ttl=TTL, reserved_for=reserved_for, hold=hold))


@pytest.mark.parametrize(("reserved_for", "hold", "now", "claimable", "here"), [
    (None, 0.0, 0.0, True, False),
    ("me", 30.0, 0.0, True, True),
    ("b", 30.0, 0.0, False, False),
    ("b", 30.0, 29.9, False, False),
    ("b", 30.0, 30.0, True, False),
    ("b", 0.0, 0.0, True, False),
], ids=[
    "a free lease: anyone's",
    "kept for this node: claimable at once, and claimed first",
    "kept for another: held",
    "...until this node has seen it unchanged for the hold",
    "...and then anyone's",
    "a reservation of no time holds nothing",
])
def test_a_free_lease_kept_for_a_node(reserved_for: str | None, hold: float, now: float,
                                       claimable: bool, here: bool) -> None:
    view = make_view()
    stored = free_lease(reserved_for, hold)
    view.observe({2: stored}, 4, 0.0, ())
    assert view.claimable(2, stored, now) is claimable
    assert view.reserved_here(stored) is here


def test_a_reservation_counts_from_when_this_node_saw_its_version() -> None:
    view = make_view()
    view.observe({2: free_lease("b", 30.0, "v1")}, 4, 0.0, ())
    # Written again (a new version): the hold starts over in this node's eyes.
    again = free_lease("b", 30.0, "v2")
    view.observe({2: again}, 4, 20.0, ())
    assert not view.claimable(2, again, 45.0)
    assert view.claimable(2, again, 50.0)


@pytest.mark.parametrize(("seen", "known", "expected"), [
    ({}, {0: 5}, {0: 5}),                 # a store that never held the shard: the outside word
    ({0: 7}, {0: 5}, {0: 7}),             # never lowered
    ({0: 3}, {0: 5, 2: 1}, {0: 5, 2: 1}),
    ({0: 3}, {}, {0: 3}),
])
def test_generations_known_from_outside_the_store_only_raise_the_floor(
        seen: dict[int, int], known: dict[int, int], expected: dict[int, int]) -> None:
    view = make_view()
    view.max_generation.update(seen)
    view.known_generations(known)
    assert view.max_generation == expected


def owned(owner: str, renewal: str = "shard", generation: int = 3,
          incarnation: str = "i1") -> Stored[Lease]:
    return Stored("v1", Lease(cluster="c", shard=2, owner=owner, generation=generation,
                              incarnation=incarnation, write_id="w", ttl=TTL,
                              renewal=renewal))  # type: ignore[arg-type]


@pytest.mark.parametrize(("before", "known", "gone_at", "keepers", "now", "claimable"), [
    (None, 0, 0.0, [], 0.0, True),
    (None, 5, 0.0, [], 0.0, False),
    (None, 5, 0.0, [], TTL + 0.1, True),
    ("b", 0, 10.0, [], 10.0, False),
    ("b", 0, 10.0, [], 10.0 + TTL, False),
    ("b", 0, 10.0, [], 10.1 + TTL, True),
    (None, 0, 10.0, [], 10.0, False),
    ("me", 0, 10.0, [], 10.0, False),
    (None, 5, 0.0, [epoch([2], node="c")], TTL + 0.1, False),
    (None, 5, 0.0, [epoch([1], node="c")], TTL + 0.1, True),
    (None, 5, 0.0, None, TTL + 0.1, False),
    ("b", 0, 10.0, [epoch([2], node="c")], 10.1 + TTL, False),
], ids=[
    "never seen, no generation known: a new shard, claimable at once",
    "a generation published (known_generations): missing for a TTL first",
    "...and then claimable, once the epochs say nobody keeps it",
    "seen owned, then gone: its owner's until missing for a TTL",
    "...not a moment before",
    "...and then claimable",
    # (Another node may have claimed it unseen since, and then lost its record.)
    "seen free, then gone: missing for a TTL first too",
    "seen ours (this incarnation, freed), then gone: missing for a TTL first too",
    # Issue 38, family B: an owner this node never saw keeps it by its epoch.
    "a generation known, the record never seen: not while a live epoch keeps it",
    "...but an epoch that keeps others is no keeper",
    "...and not if the epochs could not be read",
    "seen owned, then gone, kept by another live epoch: not either",
])
def test_a_missing_record_this_node_knew_existed(
        before: str | None, known: int, gone_at: float, keepers: list[Epoch] | None,
        now: float, claimable: bool) -> None:
    view = make_view()
    if known:
        view.known_generations({2: known})
    if before is not None:
        view.observe({2: owned(before, incarnation="mine" if before == "me" else "i1")},
                     4, 0.0, ())
    elif gone_at > 0:
        view.observe({2: free_lease(None, 0.0)}, 4, 0.0, ())
    view.observe({}, 4, gone_at, ())
    view.observe({}, 4, now, ())
    # What the loop's round does for a damaged record unchanged for a TTL.
    if 2 in view.idle and 2 in view.damaged:
        view.attribute([2], {}, keepers, now, since=0.0)
    assert view.claimable(2, None, now) is claimable


@pytest.mark.parametrize(("stored", "now", "claimable"), [
    (free_lease(None, 0.0), 10.0, False),
    (free_lease("me", TTL), 10.0 + TTL, False),
    (free_lease("me", TTL), 10.1 + TTL, True),
    (free_lease(None, 0.0), 10.1 + TTL, True),
], ids=[
    "a free record: not within a TTL of the refusal",
    "its own free, kept for it: not within a TTL either",
    "...and then claimable",
    "a free record a TTL after: claimable",
])
def test_after_an_outdated_refusal_nothing_is_claimed_for_a_ttl(
        stored: Stored[Lease], now: float, claimable: bool) -> None:
    view = make_view()
    view.observe({2: stored}, 4, 0.0, ())
    view.refused(2, 9, 10.0)
    assert view.max_generation[2] == 9
    assert view.claimable(2, stored, now) is claimable


@pytest.mark.parametrize(("seen_ttls", "wait"), [
    ((), TTL),
    ((TTL, 90.0), 90.0),
    ((90.0, TTL), 90.0),
], ids=[
    "nothing longer seen: this node's TTL",
    "a record of a TTL cut in place since (90 then 15): the longer",
    "...whichever record said it",
])
def test_a_refusal_waits_the_longest_ttl_a_node_may_still_hold_the_shard_by(
        seen_ttls: tuple[float, ...], wait: float) -> None:
    # Issue 38, family C: the unseen owner may renew at a TTL longer than
    # this node's (cut in place), and be valid by it while its writes fail.
    view = make_view()
    for k, ttl in enumerate(seen_ttls):
        view.observe({1: Stored(f"v{k}", Lease(cluster="c", shard=1, owner="b", generation=1,
                                                 incarnation="i1", write_id="w", ttl=ttl))},
                     4, float(k), ())
    assert view.refusal_wait(2) == wait
    view.refused(2, 9, 10.0)
    assert not view.claimable(2, free_lease(None, 0.0), 10.0 + wait)
    assert view.claimable(2, free_lease(None, 0.0), 10.1 + wait)


@pytest.mark.parametrize(("kept", "wait"), [
    (30.0, 30.0),
    (6.0, TTL),
    (None, TTL),
], ids=[
    "the free keeps it longer (a heartbeat said 30): this node waits as long",
    "never shorter than the refusal's own wait",
    "not known yet (the free not started): the refusal's own wait",
])
def test_a_refusing_node_waits_as_long_as_its_free_keeps_the_shard(
        kept: float | None, wait: float) -> None:
    # Regression seed-143: a joiner knows only its own TTL; the heartbeats,
    # read by its free, say that a node holds a lease by a longer one.
    view = make_view()
    view.refused(2, 9, 10.0)
    if kept is not None:
        view.keep_off(2, kept)
    view.keep_off(3, 99.0)  # (no refusal there: nothing to keep off)
    assert 3 not in view.refused_at
    assert not view.claimable(2, free_lease(None, 0.0), 10.0 + wait)
    assert view.claimable(2, free_lease(None, 0.0), 10.1 + wait)


@pytest.mark.parametrize(("reserved_for", "keepers", "now", "claimable"), [
    (None, [], 9.9 + TTL, False),
    (None, [], 10.1 + TTL, True),
    (None, [epoch([2], node="c")], 10.1 + TTL, False),
    (None, None, 10.1 + TTL, False),
    ("me", None, 10.0, True),
], ids=[
    "a free kept from every node (a refusal's): not by a node that knows nothing of it",
    "...until it has seen it unchanged for the hold, and no epoch keeps it",
    "...never while a live epoch keeps it (the owner whose record was lost)",
    "...nor if the epochs could not be read",
    "one kept for this node's name (a handoff's): at once",
])
def test_a_free_kept_from_every_node_holds_off_a_restarted_node_too(
        reserved_for: str | None, keepers: list[Epoch] | None, now: float,
        claimable: bool) -> None:
    # Issue 38, A4: the refusing node's next incarnation (a restart, a new
    # loop) knows nothing of the refusal but what the record says; and
    # families A and B in node mode: the owner whose record was lost keeps
    # the shard by its epoch, whatever the hold.
    view = make_view()
    stored = free_lease(reserved_for, TTL)
    view.observe({2: stored}, 4, 10.0, ())
    view.observe({2: stored}, 4, now, ())
    if 2 in view.idle and 2 in view.damaged:
        view.attribute([2], {2: stored}, keepers, now, since=0.0)
    assert view.claimable(2, stored, now) is claimable


def record(owner: str | None, generation: int, version: str,
           incarnation: str | None = "i1") -> Stored[Lease]:
    return Stored(version, Lease(cluster="c", shard=2, owner=owner, generation=generation,
                                 incarnation=incarnation if owner else None, write_id=version,
                                 ttl=TTL, renewal="node"))


@pytest.mark.parametrize(("after", "keepers", "now", "claimable", "blind"), [
    (record(None, 3, "v2"), [epoch([2], node="b")], 12.1 + TTL, False, True),
    (record(None, 3, "v2"), [], 12.1 + TTL, True, True),
    (record(None, 3, "v2"), [], 12.0 + TTL, False, True),
    (record(None, 1, "v2"), None, 12.1 + TTL, False, True),
    (record("c", 1, "v2"), [epoch([2], node="b")], 12.1 + TTL, False, True),
    (record("c", 1, "v2"), [], 12.1 + TTL, False, True),
    (record(None, 4, "v2"), None, 12.0, True, False),
    (record("b", 3, "v2"), None, 12.0, False, False),
], ids=[
    "freed at its generation by a node that never saw it: not while b's epoch keeps it",
    "...claimable once no live epoch keeps it, a TTL after it came",
    "...not a moment before",
    "claimed and freed at 1 by a node that never saw it: not while the epochs are unread",
    "claimed by such a node: judged by the epochs too, not by its owner's",
    # (The claim path ends the epoch a claimable node-mode record names: a
    # live one's end fenced its node, on the tree merged with seed143.)
    "...and never while its own epoch lives, though no epoch says it keeps it yet",
    "freed above the generation that vanished: a release like any other",
    "b's own record written back: b's again, kept by its live epoch",
])
def test_a_record_written_where_this_node_saw_one_deleted(
        after: Stored[Lease], keepers: list[Epoch] | None, now: float, claimable: bool,
        blind: bool) -> None:
    """Issue 38, family B through a blind claim (regression seed-3245220484)."""
    view = make_view()
    view.observe({2: record("b", 3, "v1")}, 4, 0.0, ())
    view.observe({}, 4, 10.0, ())  # deleted: b may keep it by its epoch unseen
    view.observe({2: after}, 4, 12.0, ())
    view.observe({2: after}, 4, now, ())
    if 2 in view.idle and 2 in view.damaged:
        view.attribute([2], {2: after}, keepers, now, since=0.0)
    assert (2 in view.vanished, view.claimable(2, after, now)) == (blind, claimable)


@pytest.mark.parametrize(("claimed", "blind"), [
    (record("c", 1, "v2"), True),
    (record("c", 3, "v2"), True),
    (record("b", 3, "v2", incarnation="i2"), True),
    (record("c", 4, "v2"), False),
    (record("b", 3, "v2"), False),
    (record(None, 3, "v2"), False),
], ids=[
    "claimed at 1 by a node that never saw it: a claim over a deletion unseen",
    "...at the same generation",
    "...by another incarnation of its owner (a restart that never saw it)",
    "claimed above it: a claim over it, like any other",
    "its owner's own record again (a repair, a write whose answer was lost)",
    "freed at its generation: its owner's free, as far as anyone can tell",
])
def test_a_claim_over_a_deletion_this_node_never_saw(
        claimed: Stored[Lease], blind: bool) -> None:
    """Regression seed-1080542040: the record deleted and claimed blind
    between two of this node's listings, which never showed it missing."""
    view = make_view()
    view.observe({2: record("b", 3, "v1")}, 4, 0.0, ())
    view.observe({2: claimed}, 4, 10.0, ())
    assert (2 in view.vanished) is blind
    if blind:  # judged by the epochs, like the deleted record: b's keeps it
        freed = record(None, claimed.generation or 0, "v3")
        view.observe({2: freed}, 4, 12.1 + TTL, ())
        view.attribute([2], {2: freed}, [epoch([2], node="b")], 12.1 + TTL, since=0.0)
        assert not view.claimable(2, freed, 12.1 + TTL)


@pytest.mark.parametrize(("keepers", "ended", "kept"), [
    (None, (), None),
    ([], (), frozenset()),
    ([epoch([1, 3])], (), frozenset({1, 3})),
    ([epoch([1]), epoch([2, 3], node="c")], (), frozenset({1, 2, 3})),
    ([epoch([])], (), frozenset()),
    ([epoch(None)], (), None),
    ([epoch("A")], (), None),
    ([epoch([1]), epoch(None, node="c")], ("c",), frozenset({1})),
    ([epoch([1]), epoch([2], node="c")], ("b",), frozenset({2})),
], ids=[
    "epochs that could not be read: any shard may be kept",
    "no epoch: none is kept",
    "an epoch keeps what its bitmap says",
    "several epochs: what any of them keeps",
    "an epoch that keeps nothing",
    "a live epoch that says nothing may keep anything",
    "a live epoch whose bitmap cannot be read may keep anything",
    "an ended epoch keeps nothing, whatever it says",
    "...nor what its bitmap says",
])
def test_what_the_live_epochs_keep_for_a_blind_claim(
        keepers: list[Epoch] | None, ended: tuple[str, ...],
        kept: frozenset[int] | None) -> None:
    # Issue 38 (regression seed-123095345): a node-mode claim of a shard
    # whose generation this node never knew is not made while a live epoch
    # of another node keeps it.
    view = make_view()
    for node in ended:
        view.epochs.ended.add((node, "e1"))
    assert view.kept_live(keepers, 20.0) == kept
