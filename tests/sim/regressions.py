"""Regression cases for the simulation: every case the explorer
(`python -m shardlease.sim.explore`) ever found, once its bug is fixed, and a
few hand-made cases of the combinations the explorer is meant to draw.
tests/sim/test_explore.py runs each one (`test_regression`) and asserts no
invariant breaks.

Add a found case as the entry `python -m shardlease.sim.explore --replay SEED
...` prints at its end (`Regression("seed-SEED", note, SwarmCase(...))`: the
case itself, since a seed names another case once the drawing code changes),
with a note of what it exercises and what broke. A case whose bug is not
fixed yet goes into PENDING instead: the suite expects it to fail
(test_pending_cases_still_fail, strict), so its fix fails that test until
the case moves to REGRESSIONS. PENDING_KINDS are the fault kinds the swarm
property test leaves out while such a bug is open (the explorer draws them).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlease.records import Renewal
from shardlease.sim import (
    LEASE_WRITES,
    Abort,
    Corrupt,
    Crash,
    Fault,
    Hints,
    HostFault,
    Join,
    Leave,
    Pause,
    Reconfigure,
    StoreFault,
    SwarmCase,
)

#: Options changes of the found cases below.
SLOWER: tuple[tuple[str, float | None], ...] = (
    ("lease_ttl", 90.0), ("interval", 10.0), ("margin", 5.0))
FASTER: tuple[tuple[str, float | None], ...] = (
    ("lease_ttl", 6.0), ("interval", None), ("margin", None))
FAST_9: tuple[tuple[str, float | None], ...] = (
    ("lease_ttl", 9.0), ("interval", None), ("margin", None))
TTL_45: tuple[tuple[str, float | None], ...] = (
    ("lease_ttl", 45.0), ("interval", None), ("margin", None))


@dataclass(frozen=True)
class Regression:
    """A case and what it exercises. Found ones are named seed-<case seed>
    and hold the case itself, as `--replay` prints it: a seed names another
    case once the drawing code (shardlease.sim.swarm) changes."""

    name: str
    note: str
    case: SwarmCase


def _case(renewal: Renewal, faults: list[Fault], *, nodes: int = 3, shards: int = 8,
          seed: int = 1, lease_ttl: float = 15.0, kinds: tuple[str, ...] = ()) -> SwarmCase:
    return SwarmCase(nodes=nodes, shards=shards, seed=seed, lease_ttl=lease_ttl, interval=None,
                     margin=None, max_concurrency=16, renewal=renewal,
                     faults=tuple(faults), kinds=kinds)


def _ttl_cut(first: float, late: str, nodes: int, to: float = 15.0,
             delay: float = 2.5) -> list[Fault]:
    """Every node's lease_ttl cut in place (interval and margin follow), one of
    them `delay` seconds after the others, as a rollout does."""
    change = (("lease_ttl", to), ("interval", None), ("margin", None))
    names = [f"n{k}" for k in range(nodes)]
    return [*(Reconfigure(first, n, change) for n in names if n != late),
            Reconfigure(first + delay, late, change), Reconfigure(first + delay, None, change)]


CUT_TO_6 = (("lease_ttl", 6.0), ("interval", None), ("margin", None))

REGRESSIONS: list[Regression] = [
    # An owner's create of its epoch whose answers were lost went on being
    # retried, beat after beat, as a create: a peer ended and deleted the
    # silent record as garbage, the next create brought the ended epoch back,
    # the owner claimed under it, and the peer's stale "collected" mark then
    # deleted it without a compare-and-swap: six shards fenced unannounced
    # ((k)); with a takeover end the peer's "ended" mark would have been a
    # licence to take them at once. Fixed: an epoch whose create went
    # unanswered is never created again; the node moves to a new epoch id.
    Regression("seed-1723567695",
               "pause,reconfigure_ttl,host,reconfigure_margin,lost_answers: (k) n1 shard 6: "
               "self-fenced at 460.690 with no renew_slow before",
               SwarmCase(nodes=4, shards=40, seed=828121453, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             Reconfigure(at=60.0, node="n0", changes=(("margin", 27.0),)),
                             Reconfigure(at=60.0, node="n2", changes=(("margin", 27.0),)),
                             Reconfigure(at=60.0, node="n3", changes=(("margin", 27.0),)),
                             Reconfigure(at=68.4, node="n1", changes=(("margin", 27.0),)),
                             Reconfigure(at=68.4, node=None, changes=(("margin", 27.0),)),
                             HostFault(at=80.4, until=260.4, node="n1", open_latency=45.0,
                                       close_latency=9.0, open_error_rate=0.2,
                                       close_error_rate=0.6),
                             Reconfigure(at=92.5, node="n2", changes=(
                                 ("lease_ttl", 15.0), ("interval", 3.0), ("margin", 1.0))),
                             StoreFault(at=97.0, until=457.0, node="n1", lost_reply_rate=1.0),
                             Pause(at=107.2, node="n1", duration=2.0),
                             Reconfigure(at=182.5, node=None, changes=(
                                 ("lease_ttl", 15.0), ("interval", 3.0), ("margin", 1.0)))),
                         kinds=("pause", "reconfigure_ttl", "host", "reconfigure_margin",
                                "lost_answers"), origin=1723567695)),
    Regression("ttl-cut-while-epoch-writes-fail",
               "node mode, TTL 90 -> 15 in place on every node (n0 2.5 s late) while n0's epoch "
               "writes fail and a node leaves: a collected epoch's later leases (the review's A)",
               _case("node", [*_ttl_cut(150.0, "n0", 4),
                              StoreFault(160, 320, node="n0", error_rate=1.0,
                                         calls=frozenset({"update_epoch", "create_epoch"})),
                              Leave(196.0, "n2")],
                     nodes=4, shards=3, lease_ttl=90.0,
                     kinds=("reconfigure_ttl", "store_one", "leave"))),
    Regression("ttl-cut-while-renewal-answers-are-lost",
               "shard mode, TTL 90 -> 15 in place (n1 late) while n0's renewals land unheard "
               "and its read-backs fail",
               _case("shard", [*_ttl_cut(100.0, "n1", 3),
                               StoreFault(95, 200, node="n0", lost_reply_rate=1.0,
                                          calls=frozenset({"update_lease"})),
                               StoreFault(95, 200, node="n0", error_rate=1.0,
                                          calls=frozenset({"get_lease"}))],
                     shards=6, lease_ttl=90.0,
                     kinds=("reconfigure_ttl", "lost_answers", "store_one"))),
    Regression("epoch-listing-fails-while-writes-work",
               "node mode, n0's list_epochs failing for a minute (its writes fine) while n1 leaves "
               "(the review's D: the share must not widen)",
               _case("node", [StoreFault(60, 120, node="n0", error_rate=1.0,
                                         calls=frozenset({"list_epochs"})), Leave(80, "n1")],
                     shards=12, seed=3, kinds=("store_one", "leave"))),
    Regression("lease-listing-fails-while-writes-work",
               "shard mode, n0's list_leases failing for 40 s while n2 leaves",
               _case("shard", [StoreFault(50, 90, node="n0", error_rate=1.0,
                                          calls=frozenset({"list_leases"})), Leave(60, "n2")],
                     shards=12, seed=4, kinds=("store_one", "leave"))),
    Regression("lease-writes-fail-while-a-node-joins-shard",
               "shard mode, n0's lease writes failing for 145 s from before a join (the "
               "review's E; the invariants only: E is about shards left open nowhere, which no "
               "invariant times)",
               _case("shard", [StoreFault(60, 205, node="n0", error_rate=1.0, calls=LEASE_WRITES),
                               Join(70, "n2")],
                     nodes=2, shards=6, seed=5, kinds=("store_one", "join"))),
    Regression("lease-writes-fail-while-a-node-joins-node",
               "node mode, the same",
               _case("node", [StoreFault(60, 205, node="n0", error_rate=1.0, calls=LEASE_WRITES),
                              Join(70, "n2")],
                     nodes=2, shards=6, seed=5, kinds=("store_one", "join"))),
    Regression("corrupt-record-under-a-shard-mode-owner",
               "shard mode, the records of three held shards made invalid (their generation "
               "still readable): the owners give them up, peers claim over them (the review's F)",
               _case("shard", [Corrupt(60, 0, "invalid"), Corrupt(61, 5, "truncated"),
                               Corrupt(62, 9, "invalid")],
                     shards=12, seed=7, kinds=("corrupt",))),
    Regression("corrupt-record-under-a-node-mode-owner",
               "node mode, the same: an owner whose record a listing shows changed reads it "
               "again and gives the shard up (the review's F)",
               _case("node", [Corrupt(60, 0, "invalid"), Corrupt(61, 5, "truncated"),
                              Corrupt(62, 9, "invalid")],
                     shards=12, seed=7, kinds=("corrupt",))),
    # Found by the explorer on 5e79b4f (before a5df8db fixed finding A), in
    # 10 minutes of --renewal node --kinds reconfigure_ttl,store_one,leave.
    Regression("seed-961192410",
               "node mode, a canary TTL cut 90 -> 6 on n0 (the rest 90 s later): n0 collected "
               "its peers' epochs, silent by its new TTL, and took their leases: (a) two owners",
               SwarmCase(nodes=5, shards=25, seed=3440657495, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=16, renewal="node", faults=(
                             Leave(at=21.2, node="n1"),
                             Reconfigure(at=21.2, node="n1", changes=CUT_TO_6),
                             Reconfigure(at=30.3, node="n0", changes=CUT_TO_6),
                             StoreFault(at=67.0, until=157.0, node="n1", latency=4.5,
                                        error_rate=0.7, lost_reply_rate=1.0,
                                        calls=frozenset({"list_epochs"})),
                             Reconfigure(at=120.3, node=None, changes=CUT_TO_6)),
                         kinds=("reconfigure_ttl", "store_one", "leave"), origin=961192410)),
    # G (fixed: the owner writes its record back over the damage, keeping its
    # generation): a record overwritten with garbage kept no generation, and
    # the next claim over it started again from 1 ((b)). Both modes.
    Regression("seed-3665181300",
               "shard mode, corrupt: (b) shard 1: n1 asked to open generation 1 at 53.082 "
               "after n0 opened generation 1 at 8.804 (a garbage record over generation 1)",
               SwarmCase(nodes=2, shards=4, seed=331236401, lease_ttl=15.0, interval=None,
                         margin=None, max_concurrency=4, renewal="shard", faults=(
                             Corrupt(at=10.9, shard=0, how="invalid"),
                             Corrupt(at=11.7, shard=0, how="truncated"),
                             Corrupt(at=11.7, shard=1, how="garbage"),
                             Corrupt(at=32.7, shard=1, how="truncated"),
                             Corrupt(at=39.2, shard=2, how="invalid"),
                             Corrupt(at=55.6, shard=3, how="garbage")),
                         kinds=("corrupt",), origin=3665181300)),
    Regression("seed-1599298893",
               "node mode, corrupt: (b) shard 3: n4 asked to open generation 1 at 167.155 "
               "after n1 opened generation 1 at 38.704",
               SwarmCase(nodes=5, shards=5, seed=468968509, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             Corrupt(at=15.0, shard=4, how="invalid"),
                             Corrupt(at=46.4, shard=3, how="garbage"),
                             Corrupt(at=64.0, shard=4, how="garbage"),
                             Corrupt(at=111.5, shard=2, how="truncated"),
                             Corrupt(at=116.8, shard=0, how="invalid"),
                             Corrupt(at=116.8, shard=2, how="truncated")),
                         kinds=("corrupt",), origin=1599298893)),
    # H (fixed: a peer that saw the record before waits for its owner's epoch
    # to end; an owner that cannot read it back repairs it against what the
    # listing shows): node mode, a record corrupted under its live owner while
    # the owner cannot see it (its list_leases failing) or cannot read it back
    # (its get_lease failing) was claimed by a peer after a TTL: (a).
    Regression("corrupt-record-while-its-owner-cannot-list",
               "node mode, shard 0 corrupted under n0 while n0's list_leases fail for 3 TTLs: "
               "(a) n2 opens it while n0 still has it open",
               _case("node", [Corrupt(45.0, 0),
                              StoreFault(46.0, 91.0, node="n0", error_rate=1.0,
                                         calls=frozenset({"list_leases"}))],
                     shards=4, seed=2, kinds=("corrupt", "store_one"))),
    Regression("seed-3499443969",
               "node mode, corrupt,store_one: (a) shard 3: open on n2 (generation 2) at 88.025 "
               "while still open on n1 (generation 1, deadline 185.970) until 165.579 "
               "(n1's list_leases failing)",
               SwarmCase(nodes=3, shards=4, seed=3163403619, lease_ttl=30.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             StoreFault(at=5.0, until=50.0, latency=9.0, error_rate=0.7,
                                        lost_reply_rate=0.3,
                                        calls=frozenset({"list_heartbeats"})),
                             Corrupt(at=5.0, shard=2, how="invalid"),
                             StoreFault(at=40.9, until=160.9, node="n1", latency=9.0,
                                        error_rate=1.0, calls=frozenset({"list_leases"})),
                             Corrupt(at=42.5, shard=3, how="invalid"),
                             Corrupt(at=42.5, shard=2, how="truncated")),
                         kinds=("corrupt", "store_one"), origin=3499443969)),
    Regression("seed-1474307277",
               "node mode, corrupt,store_one: (a) shard 5: open on n0 (generation 2) at 44.664 "
               "while still open on n2 (generation 1, deadline 49.997) until 45.584 (every "
               "get_lease failing: n2 saw the change but could not read it back)",
               SwarmCase(nodes=3, shards=6, seed=1367914813, lease_ttl=6.0, interval=None,
                         margin=None, max_concurrency=4, renewal="node", faults=(
                             StoreFault(at=8.2, until=20.2, node="n0", error_rate=0.3,
                                        calls=frozenset({"create_epoch", "update_epoch"})),
                             Corrupt(at=17.2, shard=0, how="truncated"),
                             StoreFault(at=21.4, until=45.4, error_rate=1.0,
                                        calls=frozenset({"get_lease", "get_epoch"})),
                             StoreFault(at=29.2, until=33.4, latency=0.3, error_rate=0.7,
                                        lost_reply_rate=0.3, calls=LEASE_WRITES),
                             Corrupt(at=30.5, shard=5, how="truncated")),
                         kinds=("corrupt", "store_one"), origin=1474307277)),
    # H' (fixed: the epoch records say what they keep, and a node that never
    # saw a damaged record readable reads them before it claims it): node
    # mode, a record corrupted under its live owner whose listings are stale
    # for longer than a TTL (a lagging cache), taken by a node that joined
    # after the damage (so never saw who kept it) once it had seen the damage
    # unchanged for a TTL, while the owner still could not see it: (a).
    Regression("seed-4249663667",
               "corrupt,store_one,join,stale: (a) shard 2: open on j1 (generation 2) at 243.500 "
               "while still open on n0 (generation 1, deadline 360.539) until 250.539",
               SwarmCase(nodes=1, shards=5, seed=1332578498, lease_ttl=120.0, interval=20.0,
                         margin=10.0, max_concurrency=4, renewal="node", faults=(
                             StoreFault(at=62.8, until=242.8, node="n0", stale=True),
                             Corrupt(at=86.2, shard=2, how="truncated"),
                             Join(at=103.5, node="j1", wall_skew=0.0),
                             Join(at=109.9, node="j1", wall_skew=3600.0),
                             StoreFault(at=135.7, until=219.7, node="n0", latency=6.0,
                                        error_rate=0.3, lost_reply_rate=0.3,
                                        calls=LEASE_WRITES)),
                         kinds=("corrupt", "store_one", "join", "stale"), origin=4249663667)),
    # (d), fixed: peers that lost the race to end n2's silent epoch waited a
    # round; now one that loses reads the epoch ended and claims in the same
    # round, and a claim lost to a peer falls back on the next eligible shard
    # (placement.Plan.spare).
    Regression("seed-3481106407",
               "reconfigure_margin,crash: (d) the shards [2, 9, 10] of n2, crashed at 71.600, "
               "were not all open elsewhere within 50s (took 50.2)",
               SwarmCase(nodes=6, shards=12, seed=2494369678, lease_ttl=30.0, interval=None,
                         margin=None, max_concurrency=16, renewal="node", faults=(
                             Reconfigure(at=21.8, node=None, changes=(("margin", 15.0),)),
                             Crash(at=21.8, node="n3"),
                             Crash(at=71.6, node="n2")),
                         kinds=("reconfigure_margin", "crash"), origin=3481106407)),
    # (c), a checker bound: a move 3.7 s before the quiescence snapshot, less
    # than a round, so n0's lookup had not seen it. Routing is now checked
    # once every node has had a round after the last move.
    Regression("seed-1600028587",
               "store_one,reconfigure_margin,crash,host,join: (c) at 175.300: n0 routes "
               "shard 3 to None, not to j0",
               SwarmCase(nodes=1, shards=5, seed=2364772270, lease_ttl=30.0, interval=4.0,
                         margin=2.0, max_concurrency=16, renewal="shard", faults=(
                             StoreFault(at=12.6, until=72.6, node="j0", error_rate=1.0,
                                        calls=frozenset({"update_lease"})),
                             Crash(at=19.4, node="j0"),
                             Join(at=19.4, node="j0", wall_skew=-300.0),
                             HostFault(at=24.3, until=84.3, node=None, open_latency=15.0,
                                       close_latency=9.0, open_error_rate=0.6),
                             StoreFault(at=42.7, until=87.7, node=None, error_rate=0.7,
                                        calls=frozenset({"list_epochs"})),
                             Reconfigure(at=53.6, node="n0", changes=(("margin", 3.0),)),
                             Reconfigure(at=83.6, node=None, changes=(("margin", 3.0),))),
                         kinds=("store_one", "reconfigure_margin", "crash", "host", "join"),
                         origin=1600028587)),
    # Found once corrupt records joined the swarm: a damaged record kept by
    # an epoch that was then collected (or retired) waited for that epoch to
    # end for ever, since nothing watched the epoch once no readable lease
    # named it: (c), the shard open nowhere. The epoch a damaged record is
    # kept by is now watched as if the record named it (view.LeaseView.observe).
    Regression("seed-1721239180",
               "store_all,corrupt: (c) at 149.600: shard 1 is open on no live node",
               SwarmCase(nodes=3, shards=4, seed=47886520, lease_ttl=15.0, interval=None,
                         margin=None, max_concurrency=4, renewal="node", faults=(
                             StoreFault(at=15.5, until=38.0, jitter=1.5, error_rate=1.0,
                                        lost_reply_rate=0.3),
                             StoreFault(at=22.0, until=82.0, lost_reply_rate=0.3),
                             Corrupt(at=22.0, shard=1, how="truncated"),
                             Corrupt(at=26.5, shard=3, how="truncated"),
                             StoreFault(at=38.1, until=98.1, jitter=1.5, error_rate=1.0),
                             Corrupt(at=52.4, shard=3, how="truncated")),
                         kinds=("store_all", "corrupt"), origin=1721239180)),
    Regression("seed-122702257",
               "pause,reconfigure_interval,leave,corrupt: (c) at 559.100: shard 0 is open on "
               "no live node",
               SwarmCase(nodes=3, shards=2, seed=2878722879, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=4, renewal="node", faults=(
                             Corrupt(at=216.0, shard=1, how="garbage"),
                             Pause(at=220.3, node="n2", duration=2.0),
                             Leave(at=224.2, node="n0"),
                             Leave(at=247.9, node="n1"),
                             Corrupt(at=247.9, shard=0, how="truncated"),
                             Reconfigure(at=253.6, node="n0", changes=(("interval", None),)),
                             Reconfigure(at=253.6, node="n1", changes=(("interval", None),)),
                             Reconfigure(at=259.1, node="n2", changes=(("interval", None),)),
                             Reconfigure(at=259.1, node=None, changes=(("interval", None),))),
                         kinds=("pause", "reconfigure_interval", "leave", "corrupt"),
                         origin=122702257)),
    # A checker bug, (n): a stopping node's rounds (which no longer count the
    # node itself) were judged while a later event of its, not its leave,
    # was taken for its end.
    Regression("seed-1865680267",
               "leave,join,store_one,lost_answers,host: (n) at 23.400: n3 counted 2 live "
               "node(s), fewer than the 2 that worked throughout [5.400, 23.400]: n1, n2",
               SwarmCase(nodes=4, shards=4, seed=4178874984, lease_ttl=6.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             StoreFault(at=13.8, until=22.8, node="n0", lost_reply_rate=1.0),
                             Join(at=14.8, node="n1", wall_skew=0.0),
                             StoreFault(at=23.4, until=25.2, node="n2", latency=0.3,
                                        error_rate=1.0, lost_reply_rate=1.0,
                                        calls=frozenset({"put_heartbeat"})),
                             HostFault(at=23.4, until=25.2, node=None, open_latency=0.6,
                                       close_latency=1.8, open_error_rate=0.6,
                                       close_error_rate=0.6),
                             Leave(at=23.4, node="n3"),
                             Leave(at=24.1, node="n0")),
                         kinds=("leave", "join", "store_one", "lost_answers", "host"),
                         origin=1865680267)),
    # Found by the swarm property run in CI: shard mode, a lease TTL cut in
    # place on one node (90 s -> 6 s) while its peers kept 90 s; a record
    # corrupted under its owner (TTL 90, renewing every 30 s) was taken by
    # that node after 6 s of seeing it unchanged, its own TTL, since a
    # damaged record says none: (a) for 14 s. It now waits at least the TTL
    # of the last readable record it saw of the shard.
    Regression("seed-11041",
               "pause,reconfigure_ttl,store_one,corrupt: (a) shard 16: open on n4 (generation 2) "
               "at 371.600 while still open on n1 (generation 1, deadline 430.634) until 385.634",
               SwarmCase(nodes=6, shards=18, seed=3767791973, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=16, renewal="shard", faults=(
                             Pause(at=176.7, node="n2", duration=270.0),
                             Reconfigure(at=185.6, node="n4", changes=(
                                 ("lease_ttl", 6.0), ("interval", None), ("margin", None))),
                             Corrupt(at=360.2, shard=16, how="truncated"),
                             StoreFault(at=382.9, until=562.9, latency=4.5, error_rate=1.0,
                                        calls=frozenset({"get_epoch"})),
                             StoreFault(at=426.9, until=786.9, latency=27.0, error_rate=1.0,
                                        calls=frozenset({"get_lease", "get_epoch"})),
                             Reconfigure(at=455.6, node=None, changes=(
                                 ("lease_ttl", 6.0), ("interval", None), ("margin", None))),
                             Corrupt(at=507.9, shard=11, how="truncated")),
                         kinds=("pause", "reconfigure_ttl", "store_one", "corrupt"),
                         origin=11041)),
    # Found by the explorer once damaged records were judged by the epochs:
    # node mode, a node paused for 360 s had last seen shard 4 readable under
    # an older owner; after the pause it found the record corrupted under
    # n3 (whose listings were stale, so it could not see the damage), waited
    # for the older owner's epoch (long over) and took the shard: (a). The
    # epochs' `keeps` now judge every damaged record, whatever was seen of
    # it before.
    Regression("seed-688906653",
               "stale,pause,host,reconfigure_margin,corrupt: (a) shard 4: open on n4 "
               "(generation 3) at 542.236 while still open on n3 (generation 2, deadline "
               "704.026) until 653.100",
               SwarmCase(nodes=5, shards=10, seed=241831311, lease_ttl=120.0, interval=20.0,
                         margin=10.0, max_concurrency=4, renewal="node", faults=(
                             Pause(at=44.3, node="n4", duration=360.0),
                             StoreFault(at=168.4, until=648.4, node="n3", stale=True),
                             Reconfigure(at=225.9, node="n0", changes=(("margin", 60.0),)),
                             Reconfigure(at=233.1, node="n1", changes=(("margin", 60.0),)),
                             Reconfigure(at=284.5, node="n0", changes=(("margin", 36.0),)),
                             Reconfigure(at=284.5, node="n1", changes=(("margin", 36.0),)),
                             Reconfigure(at=284.5, node="n2", changes=(("margin", 36.0),)),
                             Reconfigure(at=284.5, node="n3", changes=(("margin", 36.0),)),
                             Reconfigure(at=294.0, node="n4", changes=(("margin", 36.0),)),
                             Reconfigure(at=294.0, node=None, changes=(("margin", 36.0),)),
                             Corrupt(at=298.8, shard=4, how="invalid"),
                             HostFault(at=332.6, until=572.6, node="n2", open_latency=60.0,
                                       close_latency=12.0, open_error_rate=0.2,
                                       close_error_rate=0.2),
                             Reconfigure(at=593.1, node=None, changes=(("margin", 60.0),))),
                         kinds=("stale", "pause", "host", "reconfigure_margin", "corrupt"),
                         origin=688906653)),
    # A checker bug, (n): a node whose TTL was cut in place (90 s -> 6 s, a
    # canary) while its peers kept theirs, so their heartbeats (every 10 s)
    # looked silent to it: liveness judged apart is no failed read. (n) now
    # leaves out the times when one node's options differ from its peers'.
    Regression("seed-605181254",
               "join,reconfigure_ttl,leave: (n) at 299.400: n1 counted 3 live node(s), fewer "
               "than the 5 that worked throughout [89.400, 299.400]: n0, n2, n3, n4, n5",
               SwarmCase(nodes=6, shards=9, seed=2326728248, lease_ttl=90.0, interval=10.0,
                         margin=5.0, max_concurrency=1, renewal="shard", faults=(
                             *(Reconfigure(at=58.4, node=n, changes=SLOWER)
                               for n in ("n1", "n2", "n3", "n4", "n5", "j0")),
                             Reconfigure(at=63.4, node="n0", changes=SLOWER),
                             Reconfigure(at=63.4, node=None, changes=SLOWER),
                             Join(at=79.4, node="n0", wall_skew=0.0),
                             Leave(at=79.4, node="j0"),
                             Reconfigure(at=79.4, node="n1", changes=FASTER),
                             Reconfigure(at=89.0, node="n0", changes=FASTER),
                             Reconfigure(at=359.0, node=None, changes=FASTER)),
                         kinds=("join", "reconfigure_ttl", "leave"), origin=605181254)),
    # Found by (n) on the clean tree: node mode, one node's store calls slow
    # (up to 4.5 s, TTL 9 s): after its epoch listing, the round read the
    # suspects (epochs that looked silent between its slow listings) one by
    # one for 10 s, and only then judged who was live, by then "silent" for
    # longer than a TTL: it counted itself alone. Liveness is now judged as
    # of the listing (epochs.EpochWatch.live).
    Regression("seed-1662783497",
               "corrupt,reconfigure_ttl,store_all,join: (n) at 717.503: n1 counted 1 live "
               "node(s), fewer than the 4 that worked throughout [434.700, 717.503]: n0, n2, "
               "n3, n4",
               SwarmCase(nodes=5, shards=4, seed=1641568041, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=4, renewal="node", faults=(
                             StoreFault(at=163.6, until=253.6, node="n2", jitter=2.7,
                                        error_rate=1.0, lost_reply_rate=0.1),
                             Join(at=224.8, node="n0", wall_skew=-300.0),
                             Join(at=245.7, node="n3", wall_skew=0.0),
                             Reconfigure(at=245.7, node="n4", changes=FAST_9),
                             Reconfigure(at=335.7, node=None, changes=FAST_9),
                             Corrupt(at=497.2, shard=0, how="invalid"),
                             StoreFault(at=695.7, until=830.7, node="n1", latency=1.8,
                                        jitter=2.7, error_rate=0.1)),
                         kinds=("corrupt", "reconfigure_ttl", "store_all", "join"),
                         origin=1662783497)),
    # Found by the explorer: shard mode, n0's lease writes failing for 135 s,
    # so it fenced shard 1 and kept trying to free it; n2 claimed it
    # (generation 2); then the record was corrupted, and n0's next free,
    # refused, read it back damaged and "repaired" it with its own free
    # record: n0 claimed it again at generation 2 while n2 had it open: (a)
    # and (b). A record is repaired now only while the shard's deadline has
    # not passed (before it, nobody else may have written it).
    Regression("seed-3131304026",
               "store_one,reconfigure_interval,corrupt: (a) shard 1: open on n0 (generation 2) "
               "at 425.425 while still open on n2 (generation 2, deadline 470.507) until "
               "425.507",
               SwarmCase(nodes=5, shards=2, seed=3207033159, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="shard", faults=(
                             StoreFault(at=276.4, until=411.4, node="n0", error_rate=1.0,
                                        calls=frozenset({"create_lease", "update_lease"})),
                             Corrupt(at=410.8, shard=1, how="invalid"),
                             Reconfigure(at=566.0, node="n2", changes=(("interval", 18.0),)),
                             Reconfigure(at=593.0, node=None, changes=(("interval", 18.0),))),
                         kinds=("store_one", "reconfigure_interval", "corrupt"),
                         origin=3131304026)),
    # Found by the explorer ((g)): a node whose epoch creates went unanswered
    # went on with new epoch ids (c99937e); the records those creates left
    # stayed after it stopped, live-looking, until peers collected them. A
    # stop now deletes them too.
    Regression("seed-1702605342",
               "store_all,leave,crash,lost_answers: 40.500 n3: stopped but its heartbeat is "
               "still there",
               SwarmCase(nodes=5, shards=8, seed=3158752281, lease_ttl=30.0, interval=None,
                         margin=None, max_concurrency=4, renewal="node", faults=(
                             StoreFault(at=5.0, until=26.0, node="n3", lost_reply_rate=1.0),
                             Crash(at=16.7, node="n2"),
                             StoreFault(at=16.7, until=136.7, node="n4", error_rate=1.0),
                             Leave(at=40.5, node="n3")),
                         kinds=("store_all", "leave", "crash", "lost_answers"),
                         origin=1702605342)),
    # A checker bug, (n): a TTL change (9 s -> 45 s) that one node refused
    # (node mode: a margin its epoch cannot hold) left it judging its peers,
    # now writing every 15 s, by 9 s. (n) now leaves out what follows a
    # refused change.
    Regression("seed-2059624861",
               "reconfigure_ttl,store_all,pause: (n) at 774.543: n2 counted 3 live node(s), "
               "fewer than the 3 that worked throughout [504.543, 774.543]: n0, n1, n3",
               SwarmCase(nodes=4, shards=4, seed=790098747, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             StoreFault(at=122.8, until=482.8, latency=9.0, jitter=2.7,
                                        error_rate=0.5, lost_reply_rate=0.1),
                             Reconfigure(at=142.3, node="n0", changes=TTL_45),
                             Reconfigure(at=151.0, node="n3", changes=TTL_45),
                             Pause(at=209.4, node="n3", duration=135.0),
                             Reconfigure(at=209.4, node="n0", changes=FAST_9),
                             Reconfigure(at=212.0, node="n3", changes=FAST_9),
                             Reconfigure(at=239.0, node=None, changes=FAST_9),
                             Reconfigure(at=421.0, node=None, changes=TTL_45)),
                         kinds=("reconfigure_ttl", "store_all", "pause"),
                         origin=2059624861)),
    Regression("seed-4153818696",
               "the case the garbage-end-is-a-licence mutant is caught by since nodes claim in "
               "their first round once every known peer is live (5e79b4f's seed-961192410 no "
               "longer draws the interleaving): TTL cuts in place on two canaries, a leave, "
               "failing lease listings, then failing epoch writes",
               SwarmCase(nodes=3, shards=6, seed=2096913772, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             Reconfigure(at=21.6, node="n2", changes=FASTER),
                             Reconfigure(at=29.4, node="n1", changes=FASTER),
                             Reconfigure(at=119.4, node=None, changes=FASTER),
                             Leave(at=255.4, node="n1"),
                             Reconfigure(at=278.6, node="n2", changes=(
                                 ("lease_ttl", 120.0), ("interval", 20.0), ("margin", 10.0))),
                             StoreFault(at=285.2, until=375.2, node=None, error_rate=1.0,
                                        lost_reply_rate=0.3, calls=frozenset({"list_leases"})),
                             Reconfigure(at=305.6, node=None, changes=(
                                 ("lease_ttl", 120.0), ("interval", 20.0), ("margin", 10.0))),
                             StoreFault(at=511.9, until=691.9, node="n2", error_rate=1.0,
                                        lost_reply_rate=0.3,
                                        calls=frozenset({"update_epoch", "create_epoch"}))),
                         kinds=("reconfigure_ttl", "store_one", "leave"), origin=4153818696)),
    Regression("fenced-owner-repairs-over-a-peers-corrupted-claim",
               "seed-3131304026 moved (its seed 14, the lease writes failing until 406.4, "
               "the corruption at 405.8): the case the repair-after-the-deadline mutant is "
               "caught by since nodes claim in their first round once every known peer is "
               "live and the original no longer draws the interleaving",
               SwarmCase(nodes=5, shards=2, seed=14, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="shard", faults=(
                             StoreFault(at=276.4, until=406.4, node="n0", error_rate=1.0,
                                        calls=frozenset({"create_lease", "update_lease"})),
                             Corrupt(at=405.8, shard=1, how="invalid"),
                             Reconfigure(at=566.0, node="n2", changes=(("interval", 18.0),)),
                             Reconfigure(at=593.0, node=None, changes=(("interval", 18.0),))),
                         kinds=("store_one", "reconfigure_interval", "corrupt"))),
    # Issue 18, item 4: a claim over a record of pure garbage cannot know the
    # generation it must go above; a node that restarted (and so knows no
    # generation of its own) asked to open generation 1 again: (b). Fixed by
    # the application's answer (OutdatedGeneration): it refuses a generation
    # it has seen opened elsewhere, the lease is freed at its generation, and
    # the next claim is above it.
    Regression("seed-2834780249",
               "garbage,host,crash,join,store_one: (b) shard 0: n0#1 asked to open generation 1 "
               "at 511.800 after n0 opened generation 1 at 53.148",
               SwarmCase(nodes=1, shards=1, seed=1093013813, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             StoreFault(at=170.0, until=305.0, node="n0", error_rate=0.7,
                                        lost_reply_rate=1.0,
                                        calls=frozenset({"update_epoch", "create_epoch"})),
                             Corrupt(at=261.0, shard=0, how="garbage"),
                             Crash(at=284.6, node="n0"),
                             HostFault(at=294.5, until=654.5, node=None, open_latency=9.0,
                                       close_latency=27.0, refuse=frozenset({0})),
                             Join(at=391.8, node="n0", wall_skew=0.0)),
                         kinds=("garbage", "host", "crash", "join", "store_one"),
                         origin=2834780249)),
    # The same (issue 18, item 4), over records truncated and then made
    # invalid (garbage: nothing left to recover) while the only node was
    # replaced under a hold: its new incarnation claimed shard 3 at
    # generation 1 again. Found by the explorer (seed 303, 540 s) at ae06b61.
    Regression("seed-464441333",
               "corrupt,handoff,lost_answers,reconfigure_margin: (b) shard 3: n0#1 asked to open "
               "generation 1 at 394.800 after n0 opened generation 1 at 28.320",
               SwarmCase(nodes=1, shards=5, seed=1544830543, lease_ttl=90.0, interval=None,
                         margin=None, max_concurrency=16, renewal="shard", faults=(
                             Reconfigure(at=142.8, node="n0", changes=(("margin", 45.0),)),
                             Reconfigure(at=152.1, node="n0", changes=(("margin", 45.0),)),
                             StoreFault(at=161.4, until=224.4, node="n0", lost_reply_rate=0.7,
                                        calls=frozenset({"create_lease", "update_lease"})),
                             Leave(at=166.9, node="n0", hold=270.0),
                             Leave(at=171.3, node="n0", hold=27.0),
                             Corrupt(at=171.3, shard=3, how="truncated"),
                             Reconfigure(at=179.1, node=None, changes=(("margin", 45.0),)),
                             Join(at=184.8, node="n0", wall_skew=0.0),
                             Corrupt(at=245.2, shard=3, how="invalid")),
                         kinds=("corrupt", "handoff", "lost_answers", "reconfigure_margin"),
                         origin=464441333, hints=Hints(drop=0.0, delay=45.0))),
    # A graceful stop in node mode cancelled the epoch's beat in flight,
    # which had landed (a store call's answer on its way back: reply_share);
    # the end of the epoch then conflicted with it, read the record and wrote
    # again, three slow calls past the end's budget of one interval, and the
    # node left its leases and its epoch to a TTL of silence. Seen in CI on
    # real processes (test_nodes[s3-node] at 91dc689); the swarm draws it
    # since reply_share (explorer seed 11, 1,437 runs).
    Regression("seed-2100276886",
               "store_all,leave: 191.320 n0: stopped but its leases were not freed: [0]",
               SwarmCase(nodes=2, shards=2, seed=3356200450, lease_ttl=90.0, interval=10.0,
                         margin=5.0, max_concurrency=1, renewal="node", faults=(
                             StoreFault(at=153.2, until=513.2, node="n0", latency=1.8,
                                        jitter=2.7, reply_share=0.5),
                             Leave(at=169.6, node="n0", hold=0.0)),
                         kinds=("store_all", "leave"), origin=2100276886,
                         hints=Hints(drop=0.0, delay=3.0))),
    # The calls about two shards' leases hang (a hot key of the store), the
    # third's are healthy: the node fences shards 0 and 1, as it must, and
    # their frees hang. Before a55dbba the renewals' batch waited on those
    # frees, so the renewal of shard 2 came too late and it was fenced with
    # nothing wrong with its lease (sim (o)). Found by the explorer on the
    # fix taken out (tests/sim/mutants/free-held-in-the-renewals-batch.patch),
    # 101 of 498 hot_key cases; the swarm draws hot_key since.
    Regression("seed-3800609124",
               "hot_key: (o) n0 shard 2: self-fenced at 54.861 with nothing acting on that "
               "node and shard since 33.861",
               SwarmCase(nodes=1, shards=3, seed=1615770503, lease_ttl=15.0, interval=3.0,
                         margin=1.0, max_concurrency=16, renewal="shard", faults=(
                             StoreFault(at=25.2, until=55.2, node=None, latency=10.5,
                                        error_rate=0.5, lost_reply_rate=0.3, calls=LEASE_WRITES,
                                        shards=frozenset({0, 1}), reply_share=0.5),
                             StoreFault(at=35.6, until=65.6, node=None, latency=30.0,
                                        error_rate=1.0, shards=frozenset({0, 1}),
                                        reply_share=0.5)),
                         kinds=("hot_key",), origin=3800609124,
                         hints=Hints(drop=0.0, delay=4.5))),
    # Lease records deleted under their live owners. Pending since the first
    # run that drew deleted records (seed 404): a node that saw the record
    # held claimed the missing record at once, and one that never saw it
    # claimed it at generation 1, was refused as outdated by the application
    # (which held the owner's 1), freed it at 1, and the next claim (of any
    # node, a round later) opened generation 2 while the owner still had 1
    # open with a valid deadline (sim (a); the application fenced the older
    # writer). In 60-90 s of deleted-only cases, 8 of 1,280 (node mode) and 7
    # of 969 (shard mode) broke (a), each through such a refusal. Now a
    # refusal keeps the shard from every node for a TTL (view.refused, the
    # free's reservation) and a node that knows a record existed claims it
    # missing only after a TTL (view._missing_claimable): 0 of 3,377 and 0
    # of 2,011.
    Regression("seed-1051432001",
               "garbage,lost_answers,reconfigure_ttl: (a) shard 2: open on n2 (generation 2) at "
               "12.298 while still open on n4 (generation 1, deadline 104.68202375646855) until "
               "44.682",
               SwarmCase(nodes=6, shards=3, seed=604091165, lease_ttl=15.0, interval=None,
                         margin=None, max_concurrency=16, renewal="shard", faults=(
                             Reconfigure(at=3.4, node=None, changes=(
                                 ("lease_ttl", 120.0), ("interval", None), ("margin", None))),
                             Corrupt(at=8.7, shard=2, how="deleted"),
                             StoreFault(at=36.0, until=46.5, node=None, lost_reply_rate=0.7,
                                        calls=frozenset({"delete_heartbeat"})),
                             Corrupt(at=47.9, shard=0, how="garbage")),
                         kinds=("deleted", "lost_answers", "reconfigure_ttl"),
                         origin=1051432001, hints=Hints(drop=0.0, delay=0.05))),
    Regression("seed-2958541154",
               "deleted: (a) shard 2: open on n4 (generation 2) at 17.808 while still open on n1 "
               "(generation 1, deadline 45.38949944923237) until 20.389",
               SwarmCase(nodes=6, shards=4, seed=3956485877, lease_ttl=30.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             Corrupt(at=10.8, shard=2, how="deleted"),
                             Corrupt(at=21.2, shard=0, how="deleted"),
                             Corrupt(at=23.3, shard=2, how="deleted"),
                             Corrupt(at=27.3, shard=0, how="deleted"),
                             Corrupt(at=37.2, shard=0, how="deleted")),
                         kinds=("deleted",), origin=2958541154)),
    Regression("seed-1672620529",
               "deleted: (a) shard 45: open on n4 (generation 2) at 3.698 while still open on n2 "
               "(generation 1, deadline 6.756956572111337) until 3.757",
               SwarmCase(nodes=5, shards=50, seed=761216981, lease_ttl=6.0, interval=None,
                         margin=None, max_concurrency=1, renewal="shard", faults=(
                             Corrupt(at=1.0, shard=22, how="deleted"),
                             Corrupt(at=2.6, shard=45, how="deleted"),
                             Corrupt(at=8.6, shard=33, how="deleted"),
                             Corrupt(at=12.1, shard=0, how="deleted")),
                         kinds=("deleted",), origin=1672620529,
                         hints=Hints(drop=0.9, delay=0.0))),
]


def _store_change(renewal: Renewal) -> Regression:
    """Issue 18, item 4, made by hand: the shard's generation climbs to 5
    over crashes, then its record is deleted (a store change) and every node
    restarts, so only the application knows 5. The claim at 1 is refused as
    outdated; the next one (by either node) is at 6."""
    return Regression(
        f"a-store-that-lost-its-records-is-claimed-above-the-applications-{renewal}",
        "store change: claimed at 1, refused (the application holds 5), then claimed at 6; "
        "a free at the claim's own generation would climb one refusal (and cooldown) at a time",
        SwarmCase(nodes=2, shards=1, seed=7, lease_ttl=6.0, interval=None, margin=None,
                  max_concurrency=4, renewal=renewal, faults=(
                      *(f for i in range(4) for f in (Crash(20.0 + 30 * i, f"n{i % 2}"),
                                                      Join(35.0 + 30 * i, f"n{i % 2}"))),
                      Corrupt(at=140.0, shard=0, how="deleted"),
                      Crash(140.5, "n0"), Crash(140.5, "n1"),
                      Join(150.0, "n0"), Join(150.0, "n1")),
                  kinds=("deleted", "crash", "join")))


REGRESSIONS += [_store_change("node"), _store_change("shard")]

REGRESSIONS += [
    # Found by the swarm property test (hypothesis drew seed 248, node mode)
    # after stop 37's refusal kind: n3 gave up an epoch (it could not free
    # two closed shards within a TTL while every lease write failed), then
    # stopped gracefully before its peers had ended that epoch. Sim (g)
    # counted the given-up epoch's record as a heartbeat the stop left; it
    # is left for peers by design (`OwnEpoch.give_up`), and they ended it.
    # (g) now holds only the epoch current at the stop to be ended.
    Regression("seed-248",
               "join,refusal,corrupt: 20.300 n3: stopped but its heartbeat is still there",
               SwarmCase(nodes=4, shards=40, seed=3080959277, lease_ttl=6.0, interval=None,
                         margin=None, max_concurrency=1, renewal="node", faults=(
                             Reconfigure(at=2.9, node=None, changes=(
                                 ("lease_ttl", 6.0), ("interval", None), ("margin", None))),
                             StoreFault(at=4.9, until=16.9, node=None, error_rate=1.0,
                                        calls=frozenset({"create_lease", "update_lease"})),
                             Corrupt(at=4.9, shard=28, how="deleted"),
                             Join(at=6.9, node="j1"),
                             Corrupt(at=13.2, shard=35, how="truncated"),
                             Corrupt(at=15.3, shard=35, how="deleted"),
                             StoreFault(at=15.3, until=27.3, node="j0", stale=True),
                             StoreFault(at=15.3, until=27.3, node="j0", error_rate=1.0,
                                        calls=frozenset({"create_lease", "update_lease",
                                                         "get_lease"})),
                             Join(at=15.3, node="n1"),
                             Leave(at=16.3, node="n0", hold=0.6),
                             Leave(at=16.3, node="n2", hold=0.6),
                             Join(at=16.4, node="n0"),
                             Join(at=16.4, node="n2"),
                             Reconfigure(at=18.8, node=None, changes=(
                                 ("lease_ttl", 6.0), ("interval", None), ("margin", None))),
                             Leave(at=20.3, node="n3", hold=3.6),
                             Leave(at=20.3, node="j0", hold=3.6),
                             StoreFault(at=20.8, until=32.8, node="j0", error_rate=1.0,
                                        calls=frozenset({"create_lease", "update_lease"})),
                             Corrupt(at=20.8, shard=29, how="deleted"),
                             Join(at=21.4, node="j0"),
                             Join(at=22.0, node="n2", wall_skew=3600.0),
                             Join(at=22.1, node="j0"),
                             Leave(at=23.3, node="n1", hold=0.6),
                             Join(at=23.6, node="n1"),
                             Join(at=24.6, node="n3")),
                         kinds=("join", "refusal", "corrupt"), origin=248,
                         hints=Hints(drop=0.9, delay=0.6))),
    Regression(
        "seed-143",
        "garbage,lost_answers,refusal,store_all: (a) shard 0: open on j0 (generation 2) at "
        "26.690 while still open on n0 (generation 1, deadline 38.7) until 38.731. Found by "
        "the swarm property test (a random seed, 2026-12-07). Family C for a node that never "
        "saw the record: the TTL is cut from 30 to 6 at 11.8; n0's last renewal landed at "
        "10.73 with TTL 30, and its lease writes fail from 15.8; the record is deleted at "
        "15.8, when j0 joins; j0 claims it missing at 1, is refused as outdated, and waited "
        "the longest TTL it had seen (its own 6 s: it never saw a record saying 30), then "
        "opened 2 at 26.69: a node that never saw the owner's record had no source of the "
        "TTL the owner holds by. Fixed: "
        "shard-mode heartbeats carry the longest TTL their node's held leases landed with "
        "(`holds_by`), read afresh by the refusal's free, which keeps the shard that long "
        "(keeper.refusal_hold; the mutant refusal-hold-ignores-the-heartbeats)",
        SwarmCase(nodes=2, shards=1, seed=68243368, lease_ttl=30.0, interval=4.0, margin=2.0,
                  max_concurrency=16, renewal="shard", faults=(
                      Reconfigure(at=11.8, node=None, changes=(
                          ("lease_ttl", 6.0), ("interval", None), ("margin", None))),
                      StoreFault(at=15.8, until=75.8, node="n0", error_rate=1.0,
                                 calls=frozenset({"update_lease", "create_lease"})),
                      Corrupt(at=15.8, shard=0, how="deleted"),
                      Join(at=15.8, node="j0", wall_skew=0.0),
                      StoreFault(at=15.8, until=36.8, node="n1", latency=0.6, jitter=0.9,
                                 error_rate=1.0, lost_reply_rate=0.1),
                      StoreFault(at=18.0, until=27.0, node=None, lost_reply_rate=0.7),
                      StoreFault(at=20.6, until=80.6, node="n1", error_rate=1.0,
                                 lost_reply_rate=0.1),
                      Reconfigure(at=79.5, node=None, changes=(
                          ("lease_ttl", 6.0), ("interval", None), ("margin", None))),
                      StoreFault(at=83.5, until=143.5, node="n0", error_rate=1.0,
                                 calls=frozenset({"update_lease", "create_lease"})),
                      Corrupt(at=83.5, shard=0, how="deleted"),
                      Join(at=83.5, node="j0", wall_skew=0.0),
                      Corrupt(at=90.0, shard=0, how="garbage")),
                  kinds=("garbage", "lost_answers", "refusal", "store_all"), origin=143,
                  hints=Hints(drop=0.0, delay=6.0))),
    Regression(
        "seed-1080542040",
        "refusal: (a) shard 0: open on j1 (generation 2) at 436.177 while still open on n0 "
        "(generation 1, deadline 495.6) until 479.790. Found by the explorer (node mode, "
        "refusal kind, seed 2, on the mutant record-over-a-deleted-one-trusted; the tree "
        "with seed-143's fix broke it too, the tree before hid it only by a release at the "
        "instant the open ended). Family B through a blind claim that an observer never saw "
        "as one: n0 keeps shard 0 by its live epoch, its listings stale and its lease calls "
        "failing; the record is deleted at 295.9 and j0 (just joined) claims it missing at "
        "1 at 298.5, both between two of j1's listings: j1 saw n0's record at 1 replaced by "
        "j0's at 1, never the shard missing, and took j0's free (its open failed) at 358.5 "
        "for a release. Fixed: a claim at no higher generation than the record before it, "
        "by another owner, is judged as one over a deleted record "
        "(view.LeaseView._replaced)",
        SwarmCase(nodes=5, shards=4, seed=2847739426, lease_ttl=90.0, interval=None,
                  margin=None, max_concurrency=4, renewal="node", faults=(
                      Corrupt(at=142.5, shard=2, how="deleted"),
                      StoreFault(at=142.5, until=322.5, node="n4", stale=True),
                      StoreFault(at=142.5, until=322.5, node="n4", error_rate=1.0,
                                 calls=frozenset({"get_lease", "update_lease", "create_lease"})),
                      Corrupt(at=239.2, shard=3, how="deleted"),
                      Join(at=239.2, node="j1", wall_skew=0.0),
                      HostFault(at=239.2, until=419.2, node=None, open_latency=60.0),
                      Corrupt(at=250.3, shard=2, how="deleted"),
                      HostFault(at=250.3, until=430.3, node=None, open_latency=60.0),
                      Corrupt(at=253.5, shard=2, how="deleted"),
                      HostFault(at=253.5, until=433.5, node=None, open_latency=30.0),
                      StoreFault(at=253.5, until=433.5, node="n4", stale=True),
                      StoreFault(at=253.5, until=433.5, node="n4", error_rate=1.0,
                                 calls=frozenset({"get_lease", "update_lease", "create_lease"})),
                      Leave(at=262.5, node="n3", hold=9.0),
                      Join(at=262.5, node="j1", wall_skew=0.0),
                      Join(at=273.3, node="n3", wall_skew=0.0),
                      Leave(at=284.2, node="n4", hold=0.0),
                      Leave(at=295.3, node="n1", hold=0.0),
                      Corrupt(at=295.9, shard=0, how="deleted"),
                      HostFault(at=295.9, until=475.9, node=None, open_latency=30.0),
                      StoreFault(at=295.9, until=475.9, node="n0", stale=True),
                      StoreFault(at=295.9, until=475.9, node="n0", error_rate=1.0,
                                 calls=frozenset({"get_lease", "update_lease", "create_lease"})),
                      Join(at=298.5, node="j0", wall_skew=0.0),
                      Leave(at=314.2, node="n3", hold=0.0),
                      Leave(at=325.9, node="n3", hold=0.0),
                      Leave(at=325.9, node="n4", hold=0.0),
                      Leave(at=340.9, node="n1", hold=0.0),
                      Leave(at=370.9, node="n2", hold=0.0)),
                  kinds=("refusal",), origin=1080542040, hints=Hints(drop=0.9, delay=9.0))),
]

#: Found or made cases whose bug is known and not fixed yet: each must still
#: fail (test_pending_cases_still_fail); it moves to REGRESSIONS with its fix.
PENDING: list[Regression] = [
    Regression(
        "seed-3809587573",
        "abort,refusal,deleted: (a) shard 0: open on j0 (generation 2) at 160.900 while still "
        "open on n0 (generation 1, deadline 188.9) until 437.300. Found by the explorer (node "
        "mode, --kinds abort,refusal,deleted, seed 401, 2026-12-08; the code before this "
        "session's work breaks it too). Open: not debugged",
        SwarmCase(nodes=1, shards=1, seed=1781874362, lease_ttl=60.0, interval=15.0,
                  margin=20.0, max_concurrency=4, renewal="node", faults=(
                      Corrupt(at=76.8, shard=0, how="deleted"),
                      Reconfigure(at=103.9, node=None, changes=FASTER),
                      StoreFault(at=118.9, until=238.9, node="n0", error_rate=1.0,
                          calls=LEASE_WRITES),
                      Corrupt(at=118.9, shard=0, how="deleted"),
                      HostFault(at=125.7, until=191.7, node="n0", close_error_rate=1.0),
                      Abort(at=131.7, node="n0"),
                      Corrupt(at=133.7, shard=0, how="deleted"),
                      Join(at=133.9, node="j0"),
                      Corrupt(at=137.3, shard=0, how="deleted"),
                      HostFault(at=137.3, until=227.3, open_latency=15.0),
                      StoreFault(at=137.3, until=257.3, node="n0", stale=True),
                      StoreFault(at=137.3, until=257.3, node="n0", error_rate=1.0,
                          calls=frozenset({"create_lease", "get_lease", "update_lease"})),
                      Join(at=152.3, node="j1"),
                      Join(at=174.8, node="j1")),
                  kinds=("abort", "refusal", "deleted"), origin=3809587573,
                  hints=Hints(drop=0.0, delay=22.5))),
    Regression(
        "seed-3448659713",
        "blind_claim: (a) shard 0: open on n0 (generation 2) at 17.900 while still open on n1 "
        "(generation 1, deadline 22.4) until 22.407. Found by the explorer (shard mode, the "
        "blind_claim kind, 2026-12-07), a family of its own: a missing record's ABA under a "
        "stale listing. n1 holds 0 from 1.9; its record is deleted at 4.2 and again at 4.6 "
        "(j0 claimed it blind in between, and died); n0's listings are stale from 4.2 to "
        "16.6, frozen showing it missing, while n1 writes its record back and renews it; "
        "deleted again at 17.9, n0 sees it missing as it has since 4.2, takes it for gone "
        "longer than a TTL and claims 2. Open: a create on a missing record cannot tell "
        "missing all along from missing, written and deleted again, and the stale listing hid "
        "the middle",
        SwarmCase(nodes=3, shards=2, seed=2341243280, lease_ttl=6.0, interval=None,
                  margin=None, max_concurrency=1, renewal="shard", faults=(
                      Reconfigure(at=2.2, node=None, changes=FASTER),
                      StoreFault(at=4.2, until=16.2, node="n0", stale=True),
                      StoreFault(at=4.2, until=16.2, node="n0", error_rate=1.0,
                          calls=frozenset({"create_lease", "get_lease", "update_lease"})),
                      Corrupt(at=4.2, shard=0, how="deleted"),
                      Corrupt(at=4.2, shard=1, how="deleted"),
                      HostFault(at=4.2, until=16.2, node="j0", open_latency=4.0),
                      StoreFault(at=4.2, until=16.2, node="n0", error_rate=1.0, calls=LEASE_WRITES),
                      Corrupt(at=4.2, shard=1, how="deleted"),
                      HostFault(at=4.2, until=16.2, node="j0", open_latency=8.0),
                      Join(at=4.2, node="j1"),
                      Join(at=4.4, node="j0"),
                      StoreFault(at=4.6, until=16.6, node="n0", stale=True),
                      StoreFault(at=4.6, until=16.6, node="n0", error_rate=1.0,
                          calls=frozenset({"create_lease", "get_lease", "update_lease"})),
                      Corrupt(at=4.6, shard=1, how="deleted"),
                      Corrupt(at=4.6, shard=0, how="deleted"),
                      Join(at=4.6, node="j0"),
                      HostFault(at=4.6, until=16.6, node="j0", open_latency=4.0),
                      Join(at=4.6, node="j1"),
                      Join(at=4.8, node="j0"),
                      Crash(at=5.2, node="j0"),
                      Join(at=6.2, node="j1"),
                      Abort(at=6.2, node="j0", what="task"),
                      Reconfigure(at=9.9, node=None, changes=FASTER),
                      Abort(at=10.6, node="j0"),
                      StoreFault(at=11.9, until=23.9, node="n2", error_rate=1.0,
                          calls=LEASE_WRITES),
                      Corrupt(at=11.9, shard=1, how="deleted"),
                      Join(at=11.9, node="j0"),
                      HostFault(at=11.9, until=23.9, node="j0", open_latency=2.0),
                      Join(at=15.9, node="j1"),
                      Reconfigure(at=15.9, node=None, changes=FASTER),
                      Abort(at=17.9, node="j0"),
                      StoreFault(at=17.9, until=29.9, node="n1", error_rate=1.0,
                          calls=LEASE_WRITES),
                      Corrupt(at=17.9, shard=0, how="deleted"),
                      Corrupt(at=17.9, shard=1, how="deleted"),
                      HostFault(at=17.9, until=29.9, node="j1", open_latency=4.0),
                      Join(at=17.9, node="j0")),
                  kinds=("blind_claim",), origin=3448659713, hints=Hints(drop=0.3, delay=0.02))),
]


def _aborted_while_closes_fail(renewal: Renewal) -> Regression:
    """Issue 38, item 1, found by the swarm's abort kind (seed 577090037, in
    both modes): n0's application refuses every close from 52.5; at 67.5 the
    renewals task of n0's loop fails (the loop aborts). Its runner's closes
    fail on the way out, yet every lease was freed (`_abandon`): n2 opened
    shard 0 at 69.7 and n0's restart at 73.4, while n0's application still
    had it open with a deadline of 86.6. Also n1 gets a second signal during
    its graceful stop (an abort of its loop at 66.7)."""
    return Regression(
        f"seed-577090037-{renewal}",
        "abort: (a) shard 0: open on n2 (generation 2) at 69.665 while still open on n0 "
        "(generation 1, deadline 86.59811452670777) until 182.500",
        SwarmCase(nodes=3, shards=2, seed=1658794517, lease_ttl=30.0, interval=None,
                  margin=None, max_concurrency=16, renewal=renewal, faults=(
                      HostFault(at=52.5, until=82.5, node="n0", close_error_rate=1.0),
                      Leave(at=60.7, node="n1", hold=0.0),
                      Abort(at=66.7, node="n1", what="loop"),
                      Abort(at=67.5, node="n0", what="task"),
                      Join(at=70.5, node="n0", wall_skew=0.0),
                      Join(at=81.7, node="n1", wall_skew=0.0)),
                  kinds=("abort",), origin=577090037, hints=Hints(drop=0.0, delay=3.0)))


REGRESSIONS += [
    _aborted_while_closes_fail("shard"),
    _aborted_while_closes_fail("node"),
    Regression(
        "seed-2448128506",
        "abort: (c) at 73.230: shard 0 is open on no live node. n0#1's runner is cancelled "
        "(an abort) at 26.4, just as its heartbeat answered: Python 3.11's wait_for in "
        "Calls.joined returned the answer and dropped the cancellation of the heartbeats "
        "task, which then ran on for ever; the loop's abort waited on it, so n0#1 never "
        "ended and peers counted it live for good",
        SwarmCase(nodes=4, shards=3, seed=755396641, lease_ttl=6.0, interval=None,
                  margin=None, max_concurrency=4, renewal="shard", faults=(
                      HostFault(at=16.7, until=22.7, node="n2", close_latency=6.0),
                      HostFault(at=18.8, until=22.4, node="n0", close_error_rate=1.0),
                      Abort(at=19.4, node="n0", what="task"),
                      Abort(at=19.7, node="n2", what="loop"),
                      HostFault(at=21.4, until=30.4, node="n3", close_error_rate=1.0),
                      Leave(at=21.4, node="n3", hold=0.0),
                      Join(at=22.4, node="n0", wall_skew=0.0),
                      Join(at=22.7, node="n2", wall_skew=0.0),
                      HostFault(at=24.1, until=27.7, node="n1", close_error_rate=1.0),
                      Abort(at=24.4, node="n3", what="loop"),
                      Abort(at=24.7, node="n1", what="runner"),
                      Join(at=25.0, node="n3", wall_skew=0.0),
                      HostFault(at=26.4, until=44.4, node="n0", close_latency=6.0),
                      Abort(at=26.4, node="n0", what="runner")),
                  kinds=("abort",), origin=2448128506, hints=Hints(drop=0.3, delay=0.0))),
]

REGRESSIONS += [
    Regression(
        "seed-2703050138",
        "refusal: (a) shard 1: open on j1 (generation 2) at 72.500 while still open on n1 "
        "(generation 1, deadline 85.99722506927156) until 73.171. Issue 38, family B: n1 "
        "keeps shard 1 by its live epoch; its record is deleted at 55.5 and n1's lease "
        "writes fail, so it cannot write it back; j1, started at 60.5, never saw the "
        "record, claims it at 1 (refused: n1 opened 1), and claims it again at 2 a TTL "
        "later without asking the epochs, which would have said n1's keeps it",
        SwarmCase(nodes=2, shards=2, seed=419041280, lease_ttl=15.0, interval=None,
                  margin=None, max_concurrency=16, renewal="node", faults=(
                      Corrupt(at=11.0, shard=1, how="deleted"),
                      HostFault(at=11.0, until=41.0, node=None, open_latency=10.0),
                      Join(at=13.5, node="j0", wall_skew=0.0),
                      Reconfigure(at=50.5, node=None, changes=(
                          ("lease_ttl", 9.0), ("interval", None), ("margin", None))),
                      StoreFault(at=55.5, until=85.5, node="n1", error_rate=1.0,
                                 calls=LEASE_WRITES),
                      Corrupt(at=55.5, shard=1, how="deleted"),
                      Reconfigure(at=55.9, node=None, changes=(
                          ("lease_ttl", 9.0), ("interval", None), ("margin", None))),
                      Join(at=60.5, node="j1", wall_skew=0.0),
                      StoreFault(at=60.9, until=90.9, node="n0", error_rate=1.0,
                                 calls=LEASE_WRITES),
                      Corrupt(at=60.9, shard=1, how="deleted"),
                      Join(at=62.4, node="j1", wall_skew=0.0),
                      Corrupt(at=62.4, shard=1, how="deleted"),
                      Join(at=63.9, node="j0", wall_skew=0.0),
                      Leave(at=64.9, node="n1", hold=9.0),
                      Join(at=69.4, node="n1", wall_skew=0.0),
                      Corrupt(at=74.7, shard=1, how="deleted"),
                      HostFault(at=74.7, until=104.7, node=None, open_latency=2.5),
                      Corrupt(at=77.5, shard=0, how="deleted"),
                      Join(at=82.2, node="j0", wall_skew=0.0),
                      Leave(at=85.0, node="n1", hold=0.0),
                      Join(at=87.5, node="n1", wall_skew=0.0)),
                  kinds=("refusal",), origin=2703050138)),
]

REGRESSIONS += [
    Regression(
        f"seed-{origin}",
        "refusal: (a) shard 0: open on j1 (generation 2) while still open on n0 "
        "(generation 1), issue 38 family C: a TTL cut in place (90 to 15 or 9) while n0's "
        "lease writes fail; its record of shard 0, deleted, said the old TTL and n0 is "
        "valid by it; j1 (just started) was refused at 1 and waited only its own TTL",
        SwarmCase(nodes=nodes, shards=shards, seed=seed, lease_ttl=90.0, interval=interval,
                  margin=margin, max_concurrency=4, renewal="shard", faults=(
                      Reconfigure(at=cut, node=None, changes=(
                          ("lease_ttl", ttl), ("interval", None), ("margin", None))),
                      StoreFault(at=at, until=at + 180.0, node="n0", error_rate=1.0,
                                 calls=LEASE_WRITES),
                      *extra,
                      Corrupt(at=at, shard=0, how="deleted"),
                      Join(at=join, node="j1", wall_skew=0.0)),
                  kinds=("refusal",), origin=origin, hints=hints))
    for origin, nodes, shards, seed, interval, margin, cut, ttl, at, join, extra, hints in (
        (2315947158, 2, 4, 1381487692, 10.0, 5.0, 58.6, 15.0, 68.6, 71.6, (), None),
        (4272816961, 1, 10, 344656628, None, None, 35.9, 9.0, 65.9, 65.9,
         (Corrupt(at=65.9, shard=6, how="deleted"), Join(at=74.9, node="j0", wall_skew=0.0),
          Leave(at=140.9, node="n0", hold=0.0), Join(at=200.9, node="n0", wall_skew=0.0)),
         Hints(drop=0.0, delay=9.0)),
    )
]


def _refused(renewal: Renewal, what: str, extra: tuple[Fault, ...]) -> Regression:
    """Issue 38, family A, made by hand on the base case seed-2958541154 (n1
    opens shard 2 at 1 at 10.4, its record is deleted at 10.8, n2 claims it
    at 1 at 17.0 and its application refuses that): what n2 does next must
    not cut the wait short. Each broke (a) before the fix (n2's restart
    opened 2 at 19.0 while n1 was valid until 35.4 or 45.4; a stop during
    the open hid the refusal and n4 opened 2 at 32.8 while n1, its lease
    calls failing and its listings stale, was valid until 35.4 or 85.4)."""
    return Regression(
        f"a-refusal-is-waited-out-{what}-{renewal}",
        f"family A: {what}",
        SwarmCase(nodes=6, shards=4, seed=3956485877, lease_ttl=30.0, interval=None,
                  margin=None, max_concurrency=1, renewal=renewal, faults=tuple(sorted(
                      (Corrupt(at=10.8, shard=2, how="deleted"), *extra),
                      key=lambda f: f.at)),
                  kinds=("refusal",)))


OWNER_BLIND = (StoreFault(at=10.9, until=60.0, node="n1", stale=True),
               StoreFault(at=10.9, until=60.0, node="n1", error_rate=1.0,
                          calls=frozenset({"get_lease", "update_lease", "create_lease"})))
for _renewal in ("shard", "node"):
    REGRESSIONS += [
        _refused(_renewal, "a-stop-during-the-open",
                 (HostFault(at=10.9, until=40.0, open_latency=5.0),
                  Leave(at=18.0, node="n2"), *OWNER_BLIND)),
        _refused(_renewal, "a-handoff-during-the-open",
                 (HostFault(at=10.9, until=40.0, open_latency=5.0),
                  Leave(at=18.0, node="n2", hold=3.0), *OWNER_BLIND)),
        _refused(_renewal, "a-handoff-with-a-short-hold",
                 (Leave(at=18.0, node="n2", hold=3.0), Join(at=19.0, node="n2"))),
        _refused(_renewal, "a-restart-under-its-name",
                 (Leave(at=18.0, node="n2"), Join(at=19.0, node="n2"))),
    ]

REGRESSIONS += [
    Regression(
        "a-deleted-record-kept-by-a-live-epoch-node",
        "family B, made by hand: n1 keeps shard 1 by its live epoch, its listings stale and "
        "its lease calls failing from 40 (it cannot see or write back its record); the "
        "record is deleted at 50 and again at 62; j1 (started at 55) claims 1 (refused), "
        "and before the fix claimed 2 at 85 while n1 was valid until 93.3",
        SwarmCase(nodes=2, shards=2, seed=7, lease_ttl=15.0, interval=None, margin=None,
                  max_concurrency=4, renewal="node", faults=(
                      StoreFault(at=40.0, until=120.0, node="n1", stale=True),
                      StoreFault(at=40.0, until=120.0, node="n1", error_rate=1.0,
                                 calls=frozenset({"get_lease", "update_lease",
                                                  "create_lease"})),
                      Corrupt(at=50.0, shard=0, how="deleted"),
                      Corrupt(at=50.0, shard=1, how="deleted"),
                      Join(at=55.0, node="j1"),
                      Corrupt(at=62.0, shard=0, how="deleted"),
                      Corrupt(at=62.0, shard=1, how="deleted")),
                  kinds=("refusal",))),
]

REGRESSIONS += [
    Regression(
        "seed-2359467114",
        "refusal: (a) shard 8: open on n0#2 (generation 2) at 59.100 while still open on n1 "
        "(generation 1, deadline 83.0) until 59.561. Issue 38, A4, found by the swarm: n0#1's "
        "application refused shard 8 at 1 (n1 opened it; its record deleted at 45.5), the "
        "free kept it for n0's name, and n0's next incarnation claimed it at once",
        SwarmCase(nodes=2,
                  shards=20,
                  seed=768900794,
                  lease_ttl=30.0,
                  interval=None,
                  margin=None,
                  max_concurrency=16,
                  renewal="node",
                  faults=(Reconfigure(at=35.5, node=None, changes=(
                      ("lease_ttl", 15.0), ("interval", None), ("margin", None))),
                  Corrupt(at=40.0, shard=3, how="deleted"),
                  Corrupt(at=42.2, shard=19, how="deleted"),
                  Leave(at=45.0, node="n0", hold=0.0),
                  Join(at=45.2, node="j1", wall_skew=0.0),
                  StoreFault(at=45.5, until=105.5, node="n1", error_rate=1.0,
                             calls=LEASE_WRITES),
                  Corrupt(at=45.5, shard=8, how="deleted"),
                  Leave(at=47.2, node="n0", hold=0.0),
                  Leave(at=47.2, node="n1", hold=0.0),
                  Corrupt(at=47.6, shard=16, how="deleted"),
                  Join(at=47.6, node="j1", wall_skew=0.0),
                  Join(at=48.2, node="n0", wall_skew=0.0),
                  Corrupt(at=50.1, shard=11, how="deleted"),
                  Corrupt(at=50.1, shard=17, how="deleted"),
                  Join(at=53.1, node="j0", wall_skew=0.0),
                  Leave(at=55.1, node="n1", hold=9.0),
                  Leave(at=55.1, node="n1", hold=3.0),
                  Join(at=55.7, node="n1", wall_skew=0.0),
                  Leave(at=57.6, node="n0", hold=3.0),
                  Join(at=59.1, node="n0", wall_skew=0.0),
                  Join(at=60.1, node="j0", wall_skew=0.0),
                  Join(at=65.0, node="n0", wall_skew=0.0),
                  Join(at=65.9, node="n1", wall_skew=0.0),
                  Join(at=67.2, node="n1", wall_skew=0.0),
                  Leave(at=90.1, node="n0", hold=9.0),
                  Join(at=100.9, node="n0", wall_skew=0.0)),
                  kinds=("refusal",
                  ),
                  origin=2359467114,
                  hints=None)),

]

REGRESSIONS += [
    Regression(
        "seed-116120648",
        "refusal: (a) shard 0: open on n4 (generation 2) at 61.400 while still open on n1 "
        "(generation 1, deadline 108.05507749296328) until 108.055. Family C through a "
        "missing record (found by the swarm after f7aa491): n1's record (its TTL cut from "
        "90 to 9, its lease writes failing) deleted at 38.4; j1's refusal at 41.4 freed it "
        "at j1's TTL, which deleted again at 48.3 left n4 judging it missing by that last "
        "readable record's TTL, not the longest it had seen",
        SwarmCase(nodes=6, shards=3, seed=2874704853, lease_ttl=90.0, interval=10.0,
                  margin=5.0, max_concurrency=4, renewal="shard", faults=(
                      Reconfigure(at=28.4, node=None, changes=(
                          ("lease_ttl", 9.0), ("interval", None), ("margin", None))),
                      StoreFault(at=38.4, until=218.4, node="n1", error_rate=1.0,
                                 calls=LEASE_WRITES),
                      Corrupt(at=38.4, shard=0, how="deleted"),
                      Join(at=41.4, node="j1", wall_skew=0.0),
                      Corrupt(at=48.3, shard=0, how="deleted"),
                      Leave(at=53.3, node="n3", hold=27.0),
                      Join(at=66.8, node="n3", wall_skew=0.0)),
                  kinds=("refusal",), origin=116120648)),
]

REGRESSIONS += [
    Regression(
        "seed-3542864437",
        "slow_stop: n0 stopped but its leases were not freed: [0, 1, 2]. Its store slower "
        "than a round's budget from the start, its epoch's creates went unanswered; the "
        "stop deleted their records before it ended the epoch, past the TTL",
        SwarmCase(nodes=1, shards=3, seed=1082294671, lease_ttl=15.0, interval=None,
                  margin=None, max_concurrency=1, renewal="node", faults=(
                      StoreFault(at=1.1, until=18.6, node="n0", latency=5.5),
                      Leave(at=3.6, node="n0", hold=0.0),
                      StoreFault(at=29.0, until=46.5, node="n0", latency=5.5),
                      Leave(at=31.5, node="n0", hold=0.0)),
                  kinds=("slow_stop",), origin=3542864437,
                  hints=Hints(drop=0.3, delay=7.5))),
]

REGRESSIONS += [
    Regression(
        "seed-3128131752",
        "refusal: (a) shard 2: open on n1 (generation 2) at 51.700 while still open on n2 "
        "(generation 1, deadline 76.46556766680887) until 63.037. Family A in node mode, "
        "found by the swarm (the refusal kind with a blind node, on the code before "
        "f7aa491: 23 of its cases broke (a), none after): n2 keeps shard 2 by its epoch, "
        "its listings stale and its lease calls failing; j1's refusal kept the shard from "
        "the others for a TTL, after which n1 claimed it, though n2's epoch still kept it",
        SwarmCase(nodes=3, shards=15, seed=2369088092, lease_ttl=15.0, interval=3.0,
                  margin=1.0, max_concurrency=1, renewal="node", faults=(
                      Corrupt(at=32.2, shard=11, how="deleted"),
                      HostFault(at=32.2, until=50.2, node=None, open_latency=1.5),
                      StoreFault(at=32.2, until=62.2, node="n2", stale=True),
                      StoreFault(at=32.2, until=62.2, node="n2", error_rate=1.0,
                                 calls=frozenset({"get_lease", *LEASE_WRITES})),
                      Corrupt(at=32.9, shard=2, how="deleted"),
                      HostFault(at=32.9, until=50.9, node=None, open_latency=1.5),
                      StoreFault(at=32.9, until=62.9, node="n2", stale=True),
                      StoreFault(at=32.9, until=62.9, node="n2", error_rate=1.0,
                                 calls=frozenset({"get_lease", *LEASE_WRITES})),
                      Join(at=33.1, node="j1", wall_skew=0.0),
                      Join(at=37.4, node="j1", wall_skew=0.0),
                      Leave(at=39.7, node="n0", hold=0.0)),
                  kinds=("refusal",), origin=3128131752, hints=Hints(drop=0.0, delay=0.0))),
]

REGRESSIONS += [
    Regression(
        "seed-3245220484",
        "refusal: (a) shard 17: open on j1 (generation 2) at 164.087 while still open on n5 "
        "(generation 1, deadline 215.5) until 187.634. Family B through a blind claim, found by "
        "the swarm (the explorer, node mode, refusal kind): n5 keeps 17 by its live epoch, its "
        "listings stale and its lease calls failing; the record is deleted at 127.4; n2's next "
        "incarnation, which never saw it, claims it missing at generation 1 at 139.0 and frees "
        "it before it opens; j1, which had judged the deleted record n5's, took that free "
        "for a release and claimed it at once",
        SwarmCase(nodes=6, shards=60, seed=1246223333, lease_ttl=30.0, interval=None, margin=None,
                  max_concurrency=1, renewal="node", faults=(
                      Corrupt(at=40.0, shard=56, how='deleted'),
                      Join(at=40.0, node='j1', wall_skew=0.0),
                      Leave(at=55.0, node='n1', hold=3.0),
                      Join(at=56.5, node='n1', wall_skew=0.0),
                      Leave(at=65.0, node='n0', hold=18.0),
                      Leave(at=65.0, node='n4', hold=18.0),
                      Join(at=74.0, node='n0', wall_skew=0.0),
                      Join(at=74.0, node='n4', wall_skew=0.0),
                      Leave(at=80.0, node='n3', hold=18.0),
                      Join(at=83.6, node='n3', wall_skew=0.0),
                      Reconfigure(at=104.6, node=None, changes=(('lease_ttl', 9.0), ('interval',
                          None), ('margin', None))),
                      StoreFault(at=114.6, until=174.6, node='n4', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'update_lease',
                          'create_lease'}), shards=None, stale=False, reply_share=0.0),
                      Corrupt(at=114.6, shard=15, how='deleted'),
                      Corrupt(at=116.6, shard=50, how='deleted'),
                      Join(at=116.6, node='j0', wall_skew=0.0),
                      HostFault(at=116.6, until=176.6, node=None, open_latency=20.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      StoreFault(at=116.6, until=176.6, node='n4', latency=0.0, jitter=0.0,
                          error_rate=0.0, lost_reply_rate=0.0, calls=None, shards=None,
                          stale=True, reply_share=0.0),
                      StoreFault(at=116.6, until=176.6, node='n4', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'get_lease',
                          'update_lease', 'create_lease'}), shards=None, stale=False,
                          reply_share=0.0),
                      Join(at=117.6, node='j0', wall_skew=0.0),
                      Join(at=121.6, node='j0', wall_skew=0.0),
                      Corrupt(at=127.4, shard=17, how='deleted'),
                      StoreFault(at=127.4, until=187.4, node='n5', latency=0.0, jitter=0.0,
                          error_rate=0.0, lost_reply_rate=0.0, calls=None, shards=None,
                          stale=True, reply_share=0.0),
                      StoreFault(at=127.4, until=187.4, node='n5', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'get_lease',
                          'update_lease', 'create_lease'}), shards=None, stale=False,
                          reply_share=0.0),
                      Join(at=130.4, node='j1', wall_skew=0.0),
                      Leave(at=132.4, node='n2', hold=18.0),
                      Join(at=136.0, node='n2', wall_skew=0.0),
                      Leave(at=137.4, node='n4', hold=9.0),
                      Join(at=141.9, node='n4', wall_skew=0.0)),
                  kinds=("refusal",), origin=3245220484, hints=Hints(drop=0.9, delay=3.0))),
]

REGRESSIONS += [
    Regression(
        "seed-2438274690",
        "refusal: (b) shard 12: j0 asked to open generation 1 at 23.780 after n2#1 opened "
        "generation 2 at 17.600. A false alarm of check (b), found by the explorer: n2#1 "
        "claimed 2 at 9.6, the record was deleted at 11.5, and its open, queued behind slow "
        "ones, was asked at 17.6: the record never showed 2 again, so j0, which never saw "
        "it, asked 1 and was refused, as designed. (b) now ends the loss only with a claim "
        "written after it",
        SwarmCase(nodes=4, shards=40, seed=2704890983, lease_ttl=6.0, interval=None, margin=None,
                  max_concurrency=1, renewal="node", faults=(
                      Corrupt(at=5.9, shard=20, how='deleted'),
                      Corrupt(at=5.9, shard=29, how='deleted'),
                      Corrupt(at=5.9, shard=30, how='deleted'),
                      HostFault(at=5.9, until=17.9, node=None, open_latency=4.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      Join(at=6.5, node='j1', wall_skew=0.0),
                      Leave(at=7.9, node='n3', hold=0.6),
                      Join(at=7.9, node='j1', wall_skew=0.0),
                      Join(at=7.9, node='j1', wall_skew=0.0),
                      Join(at=7.9, node='j1', wall_skew=0.0),
                      Join(at=8.2, node='n3', wall_skew=0.0),
                      Leave(at=8.9, node='n2', hold=3.6),
                      Reconfigure(at=9.5, node=None, changes=(('lease_ttl', 6.0), ('interval',
                          None), ('margin', None))),
                      Join(at=9.6, node='n2', wall_skew=0.0),
                      Corrupt(at=10.4, shard=13, how='deleted'),
                      HostFault(at=10.4, until=22.4, node=None, open_latency=2.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      StoreFault(at=10.4, until=22.4, node='n2', latency=0.0, jitter=0.0,
                          error_rate=0.0, lost_reply_rate=0.0, calls=None, shards=None,
                          stale=True, reply_share=0.0),
                      StoreFault(at=10.4, until=22.4, node='n2', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'get_lease', 'update_lease'}), shards=None, stale=False,
                          reply_share=0.0),
                      Corrupt(at=10.8, shard=27, how='deleted'),
                      StoreFault(at=11.5, until=23.5, node=None, latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'update_lease'}), shards=None, stale=False, reply_share=0.0),
                      Corrupt(at=11.5, shard=12, how='deleted'),
                      Leave(at=12.8, node='n3', hold=1.8),
                      Join(at=13.2, node='n3', wall_skew=0.0),
                      Join(at=13.4, node='j0', wall_skew=0.0),
                      Join(at=13.5, node='j1', wall_skew=0.0)),
                  kinds=("refusal",), origin=2438274690, hints=Hints(drop=0.3, delay=3.0))),
]

REGRESSIONS += [
    Regression(
        "seed-123095345",
        "refusal: (a) shard 0: open on j1 (generation 2) at 37.600 while still open on n0 "
        "(generation 1, deadline 53.6) until 42.100. Family B through a blind claim seen by "
        "nobody who knew (the explorer, node mode, 2026-12-07): n0 keeps 0 by its live epoch, "
        "its listings stale and its lease calls failing; the record is deleted at 27.1, when "
        "j0 joins: j0 claims it missing at 1 and frees it before its open; j1, which joined "
        "after the deletion and never saw the record either, claims that free at 2. Open: "
        "nothing but n0's epoch (its keeps) says that n0 holds it. Fixed: a node-mode claim "
        "of a shard this node knows no generation of (a blind claim) reads the epochs "
        "first, and skips one a live epoch keeps (loop.PlacementLoop._blind, "
        "view.LeaseView.kept_live; the mutant blind-claim-ignores-the-epochs)",
        SwarmCase(nodes=2, shards=10, seed=4285018019, lease_ttl=15.0, interval=None,
                  margin=None, max_concurrency=1, renewal="node", faults=(
                      Reconfigure(at=22.1, node=None, changes=(('lease_ttl', 6.0), ('interval',
                          None), ('margin', None))),
                      Reconfigure(at=22.1, node=None, changes=(('lease_ttl', 6.0), ('interval',
                          None), ('margin', None))),
                      Reconfigure(at=22.1, node=None, changes=(('lease_ttl', 9.0), ('interval',
                          None), ('margin', None))),
                      Reconfigure(at=22.6, node=None, changes=(('lease_ttl', 9.0), ('interval',
                          None), ('margin', None))),
                      StoreFault(at=27.1, until=57.1, node='n0', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'update_lease'}), shards=None, stale=False, reply_share=0.0),
                      Corrupt(at=27.1, shard=2, how='deleted'),
                      Join(at=27.1, node='j0', wall_skew=0.0),
                      StoreFault(at=27.1, until=57.1, node='n0', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'update_lease'}), shards=None, stale=False, reply_share=0.0),
                      Corrupt(at=27.1, shard=3, how='deleted'),
                      StoreFault(at=27.1, until=57.1, node='n0', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'update_lease'}), shards=None, stale=False, reply_share=0.0),
                      Corrupt(at=27.1, shard=7, how='deleted'),
                      Corrupt(at=27.1, shard=0, how='deleted'),
                      HostFault(at=27.1, until=57.1, node=None, open_latency=5.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      StoreFault(at=27.1, until=57.1, node='n0', latency=0.0, jitter=0.0,
                          error_rate=0.0, lost_reply_rate=0.0, calls=None, shards=None,
                          stale=True, reply_share=0.0),
                      StoreFault(at=27.1, until=57.1, node='n0', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'update_lease', 'get_lease'}), shards=None, stale=False,
                          reply_share=0.0),
                      StoreFault(at=27.6, until=57.6, node='n0', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'create_lease',
                          'update_lease'}), shards=None, stale=False, reply_share=0.0),
                      Corrupt(at=27.6, shard=9, how='deleted'),
                      Join(at=27.6, node='j1', wall_skew=0.0),
                      Join(at=28.6, node='j0', wall_skew=0.0),
                      Join(at=32.1, node='j0', wall_skew=0.0),
                      Leave(at=39.6, node='n1', hold=0.0),
                      Corrupt(at=51.3, shard=3, how='deleted'),
                      Leave(at=71.3, node='n1', hold=4.5),
                      Join(at=72.2, node='n1', wall_skew=0.0)),
                  kinds=("refusal",), origin=123095345)),
    Regression(
        "seed-1851953618",
        "refusal: (a) shard 0: open on j1 (generation 2) at 83.954 while still open on n0 "
        "(generation 1, deadline 102.2) until 102.240. The shard-mode twin of seed-123095345 "
        "(the explorer, 2026-12-07): n0's listings stale and its lease calls failing, its "
        "deadline still 102.2; the record is deleted at 47.7, when j0 joins; j0 claims it "
        "missing at 1 and frees it before its open (queued behind a 20 s one); j1, which "
        "joined after the deletion, claims that free at 2. Fixed: a blind claim (no "
        "generation of it known) is not released before its host answers the open "
        "(placement.Held.blind), and a free before an answer keeps the shard from every "
        "node as a refusal's does (keeper.Held.blind); here j0's open is refused as "
        "outdated at 87.7 (the mutant blind-claim-released-before-its-open)",
        SwarmCase(nodes=2, shards=4, seed=200439945, lease_ttl=90.0, interval=10.0, margin=5.0,
                  max_concurrency=1, renewal="shard", faults=(
                      Corrupt(at=23.9, shard=3, how='deleted'),
                      StoreFault(at=23.9, until=203.9, node='n0', latency=0.0, jitter=0.0,
                          error_rate=0.0, lost_reply_rate=0.0, calls=None, shards=None,
                          stale=True, reply_share=0.0),
                      StoreFault(at=23.9, until=203.9, node='n0', latency=0.0, jitter=0.0,
                          error_rate=1.0, lost_reply_rate=0.0, calls=frozenset({'get_lease',
                          'update_lease', 'create_lease'}), shards=None, stale=False,
                          reply_share=0.0),
                      Corrupt(at=43.5, shard=3, how='deleted'),
                      HostFault(at=43.5, until=103.5, node=None, open_latency=5.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      Corrupt(at=47.7, shard=0, how='deleted'),
                      Join(at=47.7, node='j0', wall_skew=0.0),
                      HostFault(at=47.7, until=107.7, node=None, open_latency=20.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      Join(at=48.5, node='j0', wall_skew=0.0),
                      Join(at=62.7, node='j1', wall_skew=0.0),
                      Leave(at=63.9, node='n1', hold=0.0),
                      Join(at=64.9, node='n1', wall_skew=0.0),
                      Corrupt(at=237.9, shard=0, how='deleted'),
                      HostFault(at=237.9, until=297.9, node=None, open_latency=20.0,
                          close_latency=0.0, open_error_rate=0.0, close_error_rate=0.0,
                          refuse=frozenset()),
                      Join(at=252.9, node='j1', wall_skew=0.0)),
                  kinds=("refusal",), origin=1851953618, hints=Hints(drop=0.3, delay=3.0))),
]

REGRESSIONS += [
    Regression(
        "seed-2028277857",
        "blind_claim: (a) shard 0: open on j1 (generation 2) at 268.300 while still open on "
        "n0 (generation 1, deadline 281.8) until 281.772. Found by the explorer (shard mode, "
        "the new blind_claim kind, 12 cases in; made by hand first, 2026-12-07): the TTL cut "
        "from 90 to 6 at 216.3; n0's lease writes fail from 246.3, when its record of shard "
        "0 is deleted and j0 joins; j0 claims it blind at 1, its open slow (60 s); j0 "
        "crashes at 261.3 before its application answered; j1, which joined after the "
        "deletion too, sees j0's record unchanged for its TTL (6 s) and claims it at 2, "
        "which its application accepts: nothing but the application knew that generation 1 "
        "was taken, and it never answered. Fixed: a shard-mode blind claim is written with "
        "the TTL a refusal's free would keep the shard for (keeper.refusal_hold over every "
        "heartbeat's holds_by: 90 here), and not made while the heartbeats cannot be read "
        "(loop.PlacementLoop._blind; the mutant blind-claim-written-with-its-own-ttl)",
        SwarmCase(nodes=4, shards=3, seed=214138608, lease_ttl=90.0, interval=None,
                  margin=None, max_concurrency=1, renewal="shard", faults=(
                      Reconfigure(at=216.3, node=None, changes=FASTER),
                      StoreFault(at=246.3, until=426.3, node="n0", error_rate=1.0,
                                 calls=LEASE_WRITES),
                      Corrupt(at=246.3, shard=0, how="deleted"),
                      Corrupt(at=246.3, shard=2, how="deleted"),
                      HostFault(at=246.3, until=426.3, node="j0", open_latency=60.0),
                      Join(at=246.3, node="j1"),
                      StoreFault(at=246.3, until=426.3, node="n1", stale=True),
                      StoreFault(at=246.3, until=426.3, node="n1", error_rate=1.0,
                                 calls=frozenset({"update_lease", "get_lease",
                                                  "create_lease"})),
                      Join(at=246.3, node="j0"),
                      Crash(at=261.3, node="j0")),
                  kinds=("blind_claim",), origin=2028277857)),
    Regression(
        "seed-1979726345",
        "blind_claim: (a) shard 0: open on j1 (generation 2) at 22.100 while still open on n0 "
        "(generation 1, deadline 46.5) until 34.111. Found by the explorer (node mode, the "
        "blind_claim kind, 2026-12-07): n0 claims 0 at 2.53, its listings stale and its lease "
        "calls failing from 4.1, when the record is deleted; j0 joins and claims it blind at "
        "4.4, before n0's epoch named it (its next beat), so no epoch said it was kept; j0 "
        "dies at 5.6 before its application answered; j1 takes j0's record over at 2 once "
        "j0's epoch is over, while n0 keeps the shard by its epoch. Fixed: a node-mode claim "
        "over a record at generation 1 (what a blind claim writes) reads the epochs first, as "
        "a blind claim does, and is not made while a live epoch keeps the shard "
        "(loop.PlacementLoop._blind; the mutant node-mode-claims-ignore-the-epochs)",
        SwarmCase(nodes=1, shards=1, seed=998128096, lease_ttl=15.0, interval=3.0,
                  margin=1.0, max_concurrency=16, renewal="node", faults=(
                      StoreFault(at=4.1, until=34.1, node="n0", stale=True),
                      StoreFault(at=4.1, until=34.1, node="n0", error_rate=1.0,
                          calls=frozenset({"create_lease", "get_lease", "update_lease"})),
                      Corrupt(at=4.1, shard=0, how="deleted"),
                      HostFault(at=4.1, until=22.1, node="j0", open_latency=3.0),
                      Join(at=4.4, node="j0"),
                      Crash(at=5.6, node="j0"),
                      Join(at=7.1, node="j1")),
                  kinds=("blind_claim",), origin=1979726345, hints=Hints(drop=0.0, delay=0.03))),
]

REGRESSIONS += [
    Regression(
        "seed-1506566321",
        "blind_claim: (c) at 131.200: shard 4 is open on no live node, and (m). Found by the "
        "explorer (node mode, the blind_claim kind, 2026-12-07; the code before this "
        "session's fixes breaks (c) on this case too, with shard 2): n0 closes 4 at 38.7 (a "
        "release) and cannot free it, its lease calls failing; j1, which never saw the "
        "record, claims it blind at 39.2 and dies at 39.7 before its application answered; n0 "
        "learns it lost the lease at 61.5; no node claims the shard again before the end. "
        "Fixed: j1's record, a blind one where the others saw n0's deleted, was judged by "
        "the epochs, but its own epoch was watched by nobody (no lease named it in the "
        "view), so it was collected as garbage, and an epoch nobody watches is never over: "
        "the view names a blind record's own epoch too (view.LeaseView.observe; the mutant "
        "blind-record-epoch-unwatched). It fixed six more liveness cases the kind found in "
        "node mode",
        SwarmCase(nodes=4, shards=6, seed=3425594645, lease_ttl=15.0, interval=None,
                  margin=None, max_concurrency=4, renewal="node", faults=(
                      Reconfigure(at=24.7, node=None, changes=FASTER),
                      Reconfigure(at=24.7, node=None, changes=FASTER),
                      StoreFault(at=29.7, until=59.7, node="n3", error_rate=1.0,
                          calls=LEASE_WRITES),
                      Corrupt(at=29.7, shard=0, how="deleted"),
                      HostFault(at=29.7, until=59.7, node="j0", open_latency=5.0),
                      StoreFault(at=29.7, until=59.7, node="n1", error_rate=1.0,
                          calls=LEASE_WRITES),
                      Corrupt(at=29.7, shard=0, how="deleted"),
                      Corrupt(at=29.7, shard=5, how="deleted"),
                      Corrupt(at=29.7, shard=2, how="deleted"),
                      Corrupt(at=29.7, shard=4, how="deleted"),
                      HostFault(at=29.7, until=59.7, node="j1", open_latency=20.0),
                      Join(at=29.7, node="j0"),
                      Join(at=30.2, node="j0"),
                      Join(at=31.2, node="j1"),
                      StoreFault(at=31.2, until=61.2, node="n0", stale=True),
                      StoreFault(at=31.2, until=61.2, node="n0", error_rate=1.0,
                          calls=frozenset({"create_lease", "get_lease", "update_lease"})),
                      Corrupt(at=31.2, shard=4, how="deleted"),
                      Corrupt(at=31.2, shard=2, how="deleted"),
                      Corrupt(at=31.2, shard=1, how="deleted"),
                      Corrupt(at=31.2, shard=5, how="deleted"),
                      Join(at=31.2, node="j1"),
                      HostFault(at=31.2, until=61.2, node="j1", open_latency=20.0),
                      Join(at=36.2, node="j0"),
                      Join(at=39.7, node="j1"),
                      Abort(at=39.7, node="j0"),
                      Crash(at=39.7, node="j1"),
                      Crash(at=41.2, node="j1")),
                  kinds=("blind_claim",), origin=1506566321, hints=Hints(drop=0.0, delay=1.5))),
]

REGRESSIONS += [
    Regression(
        "seed-3062478051",
        "reconfigure_ttl,reconfigure_margin,refusal: (a) shard 0: open on j1 (generation 2) "
        "at 19.100 while still open on n1 (generation 1, deadline 48.0) until 22.976. Found "
        "by the explorer (the random pool, shard mode, 2026-12-07, once the refusal kind was "
        "back in it; the code before this session's work breaks it too): the TTL raised in "
        "place on n1 alone, 6 to 60, at 6.4; n1's renewal wrote 60 at once while its "
        "heartbeat still said 6; the record deleted at 8.3; j1 joined, claimed it blind, was "
        "refused as outdated, read every heartbeat, and waited 6 s. Fixed: a node's heartbeat "
        "says the TTL it writes leases with as well as the longest its held ones carry "
        "(keeper.announce), and no lease is written with a TTL above what its last landed "
        "heartbeat said (keeper.writable_ttl; the mutant lease-ttl-ahead-of-the-heartbeat)",
        SwarmCase(nodes=2, shards=2, seed=1603055262, lease_ttl=6.0, interval=None,
                  margin=None, max_concurrency=16, renewal="shard", faults=(
                      Reconfigure(at=6.4, node="n1", changes=(("lease_ttl", 60.0), ("interval",
                          15.0), ("margin", 20.0))),
                      Corrupt(at=8.3, shard=0, how="deleted"),
                      Reconfigure(at=8.3, node="n0", changes=(("margin", None),)),
                      Join(at=8.9, node="j1"),
                      Reconfigure(at=9.5, node="n0", changes=(("lease_ttl", 60.0), ("interval",
                          15.0), ("margin", 20.0))),
                      Reconfigure(at=11.1, node="n1", changes=(("margin", None),)),
                      Leave(at=11.3, node="n0", hold=3.6),
                      Join(at=15.6, node="n0"),
                      Reconfigure(at=17.1, node=None, changes=(("margin", None),)),
                      Reconfigure(at=27.5, node=None, changes=(("lease_ttl", 60.0), ("interval",
                          15.0), ("margin", 20.0)))),
                  kinds=("reconfigure_ttl", "reconfigure_margin", "refusal"), origin=3062478051,
                  hints=Hints(drop=0.0, delay=3.0))),
]

REGRESSIONS += [
    Regression(
        "seed-64947017",
        "store_all,refusal,host,garbage: (c) at 610.900: shard 1 is open on no live node. "
        "Found by the swarm property test (shard mode, 2026-12-07), after seed143's refusal "
        "hold had landed again: j0, a joiner, claims shard 1 blind after its record was "
        "deleted, is refused as outdated, and its free, the store failing one call in ten, "
        "cannot read every heartbeat: the shard is kept from every node for an hour "
        "(MAX_LEASE_TTL). Fixed: a blind claim's free (refused or never answered) keeps the "
        "shard by its record's TTL, the longest the heartbeats said at the claim, without "
        "reading them again (keeper.Keeper.free); only a refused claim of a known generation "
        "reads them",
        SwarmCase(nodes=1, shards=2, seed=1161506451, lease_ttl=60.0, interval=15.0,
                  margin=20.0, max_concurrency=16, renewal="shard", faults=(
                      Corrupt(at=30.0, shard=0),
                      StoreFault(at=148.9, until=388.9, latency=6.0, error_rate=0.1,
                          lost_reply_rate=0.3, reply_share=0.5),
                      HostFault(at=218.6, until=338.6, node="n0", close_latency=6.0,
                          open_error_rate=0.6, refuse=frozenset({0})),
                      Corrupt(at=266.6, shard=1, how="deleted"),
                      StoreFault(at=266.6, until=386.6, node="n0", stale=True),
                      StoreFault(at=266.6, until=386.6, node="n0", error_rate=1.0,
                          calls=frozenset({"create_lease", "get_lease", "update_lease"})),
                      Join(at=271.1, node="j0"),
                      Leave(at=289.1, node="n0", hold=36.0),
                      Join(at=307.1, node="n0"),
                      Corrupt(at=348.9, shard=1)),
                  kinds=("store_all", "refusal", "host", "garbage"), origin=64947017,
                  hints=Hints(drop=0.0, delay=22.5))),
]

REGRESSIONS += [
    Regression(
        "seed-3834568044",
        "stale,corrupt,refusal,abort: (a) shard 7: open on n0 (generation 2) at 124.500 while "
        "still open on n1 (generation 1, deadline 149.5) until 252.600. Found by the explorer "
        "(the random pool, node mode, 2026-12-07, once the refusal kind was back in it; the "
        "code before this session's work breaks it too): n1 keeps 7 by its epoch, its "
        "listings stale; the record is deleted at 54.5 (n0 saw it n1's); n1's runner dies at "
        "92.6 while its host stalls the close, which is abandoned at 122.0 (the application "
        "may keep the shard open until the deadline, 149.5), and n1, stopped short with a "
        "shard unclosed, deletes its epoch; n0 claims the missing record at 2 at 124.5, 2.5 s "
        "later. Peers are to wait a TTL after they see such an epoch gone. Fixed: that wait "
        "counted from when an epoch left the listing unnamed, and n1's was named (by its "
        "damaged record): an epoch gone unended while named counts too "
        "(epochs.EpochWatch.observe; the mutant named-epoch-gone-unseen)",
        SwarmCase(nodes=2, shards=20, seed=2216805052, lease_ttl=30.0, interval=None,
                  margin=None, max_concurrency=1, renewal="node", faults=(
                      Corrupt(at=11.0, shard=11, how="invalid"),
                      StoreFault(at=12.0, until=132.0, node="n1", stale=True),
                      Reconfigure(at=44.5, node=None, changes=(("lease_ttl", 15.0), ("interval",
                          None), ("margin", None))),
                      StoreFault(at=54.5, until=114.5, node="n0", error_rate=1.0,
                          calls=LEASE_WRITES),
                      Corrupt(at=54.5, shard=7, how="deleted"),
                      HostFault(at=77.6, until=122.6, node="n1", close_latency=30.0),
                      Abort(at=92.6, node="n1", what="runner")),
                  kinds=("stale", "corrupt", "refusal", "abort"), origin=3834568044,
                  hints=Hints(drop=0.3, delay=15.0))),
]

REGRESSIONS += [
    Regression(
        "seed-3736343863",
        "abort,refusal,deleted: (i) n3#1 shard 16: closed for a fence at 51.500 with no "
        "self_fence event. Found by the explorer (shard mode, --kinds abort,refusal,deleted, "
        "seed 401, 2026-12-08; the code before this session's work runs it clean, which may "
        "be only the trace moving). Fixed: the close loop "
        "fenced a lost shard whose close kept failing past its deadline without the "
        "self_fence event the watchdog emits (which skips a shard fenced already): "
        "runner._close says it too",
        SwarmCase(nodes=4, shards=20, seed=988224502, lease_ttl=15.0, interval=None,
                  margin=None, max_concurrency=16, renewal="shard", faults=(
                      Leave(at=9.0, node="n3"),
                      HostFault(at=16.5, until=61.5, node="n3", close_error_rate=1.0),
                      Abort(at=16.5, node="n3"),
                      Corrupt(at=18.1, shard=10, how="deleted"),
                      Corrupt(at=19.8, shard=12, how="deleted"),
                      Join(at=24.0, node="n3"),
                      Leave(at=34.0, node="n1"),
                      Corrupt(at=40.6, shard=16, how="deleted"),
                      HostFault(at=40.6, until=70.6, open_latency=2.5),
                      Abort(at=41.5, node="n1"),
                      Join(at=43.1, node="j1"),
                      Join(at=45.6, node="j0")),
                  kinds=("abort", "refusal", "deleted"), origin=3736343863,
                  hints=Hints(drop=0.0, delay=7.5))),
]

#: The fault kinds of the open bugs above: the swarm property test and the
#: explorer's clean-tree tests leave them out until the bugs are fixed.
#: ("refusal" was out of the random swarm from seed-143 to seed-1851953618,
#: fixed since. "blind_claim": seed-3448659713, a missing record's ABA under
#: a stale listing. "abort": seed-3809587573, found by the explorer on the
#: abort, refusal and deleted kinds; it was out for seed-3834568044 and
#: seed-3736343863 too, fixed since.)
PENDING_KINDS: tuple[str, ...] = ("blind_claim", "abort")
