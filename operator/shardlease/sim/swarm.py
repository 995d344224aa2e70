"""Swarm testing: random scenarios whose faults come from a random subset of
the fault kinds, so that combinations of two or three ordinary things at once
(a TTL cut in place while one node's epoch writes fail, a lease listing that
fails while writes work, lease writes failing while a node joins, a lease
record corrupted under its owner) are drawn often, not once in a thousand.

`draw_case(rng)` draws one `SwarmCase` from a `random.Random`; everything
about the case (sizes, options, renewal mode, the simulation's seed, the
faults) comes from that generator, so `case_for(seed)` is the same case in
every process: the explorer (`python -m shardlease.sim.explore`) and the
property test (tests/sim/test_properties.py) share it, and a seed is a
reproducer.

Each case first draws a non-empty subset of `KINDS`, then one fault of each
kind in it, then more faults of those kinds, up to `MAX_FAULTS` draws, in a
random order. Fault times are scaled to the case's TTL (drawn from
`BASE_TTLS`): each fault comes a moment to two TTLs after the one before, so
that they act together.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shardlease.records import Renewal
from shardlease.sim.faults import (
    ABORTS,
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
)
from shardlease.sim.scenario import ScenarioResult, run_scenario

#: The fault kinds a swarm case draws a subset of.
KINDS: tuple[str, ...] = (
    "crash",
    "pause",
    "store_all",  # every store call of a node (or all nodes) slow or failing
    "store_one",  # one group of store calls failing (see CALL_GROUPS), the rest healthy
    "lost_answers",  # calls applied by the store whose answers are lost, nothing else
    "hot_key",  # the calls about one or two shards' leases slow, hanging or failing (a hot key)
    "stale",  # a node's listings frozen (a lagging cache or watch)
    "host",  # the application slow or failing to open and close, or refusing shards
    "join",
    "leave",
    "handoff",  # a graceful stop keeping the leases for the node's name (`hold`), often back
    "reconfigure_ttl",  # lease_ttl changed in place (interval and margin follow, or explicit)
    "reconfigure_interval",
    "reconfigure_margin",
    "corrupt",  # a lease record made unreadable, its generation still in it
    "garbage",  # a lease record overwritten with bytes that hold nothing of it
    "deleted",  # a lease record deleted (by hand, a tool, a store changed under the cluster)
    # A node stopped short (a second SIGTERM, its runner or a task of its loop
    # dying), often while its application fails or stalls closes, sometimes
    # during a graceful stop, sometimes started again under its name.
    "abort",
    # A lease record deleted under its live owner, claimed by a node that never
    # saw it (often one just started) whose application refuses the claim as
    # outdated, and with it what may cut the refusal's wait short: a stop or
    # a release during a slow open, a handoff's hold shorter than a TTL, a
    # restart under the same name, a TTL cut in place while lease writes fail.
    "refusal",
    # A graceful stop while the node's store answers slower than a round's
    # call budget but well within a TTL (a loaded MinIO): the stop's writes
    # must still land (they get a TTL).
    "slow_stop",
    # A lease record deleted under its owner (its lease writes failing after a
    # TTL cut in place, or its listings stale and its lease calls failing),
    # claimed blind by a node that never saw it, whose open is slow and which
    # dies (a crash, or stopped short) before its application answers, while
    # a second node that never saw the record either is there to take over.
    "blind_claim",
)

#: The corruptions that leave the generation readable (`faults.Corrupt`);
#: "garbage" and "deleted" are kinds of their own: a claim over such a record
#: learns the generation from the application only (`OutdatedGeneration`).
READABLE_GENERATION = ("truncated", "invalid")

#: The groups of store calls a one-call-kind fault picks from (a fault takes
#: a whole group, or one call of it).
CALL_GROUPS: dict[str, tuple[frozenset[str], ...]] = {
    "listing": (frozenset({"list_leases"}), frozenset({"list_epochs"}),
                frozenset({"list_heartbeats"})),
    "lease_writes": (LEASE_WRITES,),
    "epoch_writes": (frozenset({"create_epoch", "update_epoch"}),),
    "heartbeat_writes": (frozenset({"put_heartbeat"}),),
    "gets": (frozenset({"get_lease", "get_epoch"}),),
    "deletes": (frozenset({"delete_heartbeat", "delete_epoch"}),),
}

#: How often a one-call-kind fault picks each group, per renewal mode (1 if
#: not named): the calls that keep the mode's leases come first.
GROUP_WEIGHTS: dict[str, dict[str, float]] = {
    "node": {"epoch_writes": 3.0, "listing": 2.0, "lease_writes": 2.0},
    "shard": {"lease_writes": 3.0, "listing": 2.0, "epoch_writes": 0.3},
}

#: The base lease TTLs (interval and margin follow, or an explicit valid combo).
BASE_TTLS: tuple[float, ...] = (15.0, 15.0, 90.0, 90.0, 30.0, 6.0)
#: Explicit (lease_ttl, interval, margin) combinations, all valid.
COMBOS: tuple[tuple[float, float, float], ...] = (
    (30.0, 4.0, 2.0), (9.0, 2.0, 1.0), (60.0, 15.0, 20.0), (120.0, 20.0, 10.0),
    (15.0, 3.0, 1.0), (90.0, 10.0, 5.0))
#: TTLs a Reconfigure may set (interval and margin then follow it).
NEW_TTLS: tuple[float, ...] = (6.0, 9.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0)
MAX_FAULTS = 6
JOINERS = ("j0", "j1")


@dataclass(frozen=True)
class SwarmCase:
    """One scenario; `run()` simulates and checks it. `origin` is the seed
    it was drawn from (None for a hand-made case), `kinds` the subset."""

    nodes: int
    shards: int
    seed: int  # the simulation's seed
    lease_ttl: float
    interval: float | None
    margin: float | None
    max_concurrency: int
    renewal: Renewal
    faults: tuple[Fault, ...]
    kinds: tuple[str, ...] = ()
    origin: int | None = field(default=None, compare=False)
    #: How the nodes' hints travel (None: no hints, as before hints existed).
    hints: Hints | None = None

    def run(self) -> ScenarioResult:
        return run_scenario(nodes=self.nodes, shards=self.shards, seed=self.seed,
                            lease_ttl=self.lease_ttl, interval=self.interval,
                            margin=self.margin, max_concurrency=self.max_concurrency,
                            renewal=self.renewal, faults=self.faults, hints=self.hints)

    def describe(self) -> str:
        """The case on a few lines: options, kinds, one fault a line."""
        opts = f"lease_ttl={self.lease_ttl:g}"
        if self.interval is not None or self.margin is not None:
            opts += f" interval={self.interval} margin={self.margin}"
        lines = [f"case {self.origin}: nodes={self.nodes} shards={self.shards} seed={self.seed} "
                 f"{opts} max_concurrency={self.max_concurrency} renewal={self.renewal}"
                 f"{f' hints={self.hints}' if self.hints else ''}",
                 f"kinds: {', '.join(self.kinds)}", "faults:"]
        lines += [f"  {f!r}" for f in self.faults]
        return "\n".join(lines)

    def reproducer(self) -> str:
        """A command that replays this case (a drawn one), else its repr."""
        if self.origin is None:
            return repr(self)
        return f"python -m shardlease.sim.explore --replay {self.origin} --renewal {self.renewal}"


def case_for(seed: int, renewal: Renewal | None = None, kinds: Sequence[str] | None = None,
             pool: Sequence[str] = KINDS) -> SwarmCase:
    """The case drawn from `seed` (see `draw_case`)."""
    return draw_case(random.Random(seed), renewal=renewal, kinds=kinds, pool=pool, origin=seed)


def draw_case(rng: random.Random, *, renewal: Renewal | None = None,
              kinds: Sequence[str] | None = None, pool: Sequence[str] = KINDS,
              origin: int | None = None) -> SwarmCase:
    """Draw one case: its renewal mode is `renewal` if given; its kinds of
    faults the subset `kinds` if given, else a subset drawn from `pool`."""
    nodes = rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5, 6))
    # Per node: below one (idle nodes), about one, or many.
    shards = min(64, max(1, round(nodes * rng.choice((0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)))))
    seed = rng.getrandbits(32)
    mode: Renewal = rng.choice(("shard", "node"))
    if renewal is not None:
        mode = renewal
    interval: float | None = None
    margin: float | None = None
    if rng.random() < 0.2:
        ttl, interval, margin = rng.choice(COMBOS)
    else:
        ttl = rng.choice(BASE_TTLS)
    concurrency = rng.choice((1, 4, 16))
    if kinds is None:
        size = rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5))
        chosen = tuple(rng.sample(list(pool), min(size, len(pool))))
    else:
        chosen = tuple(kinds)
    draws = rng.randint(len(chosen), max(MAX_FAULTS, len(chosen)))
    plan = list(chosen) + [rng.choice(chosen) for _ in range(draws - len(chosen))]
    rng.shuffle(plan)
    names = [f"n{k}" for k in range(nodes)]
    joiners = [j for j in JOINERS if "join" in chosen and rng.random() < 0.6]
    drawer = _Drawer(rng, names, [*names, *joiners], shards, ttl,
                     interval if interval is not None else ttl / 3, mode)
    faults: list[Fault] = []
    for kind in plan:
        faults.extend(drawer.draw(kind))
    faults.sort(key=lambda f: f.at)
    # Drawn last, so that a seed drew the same case before hints existed.
    hints = None
    if rng.random() < 0.7:
        pace = interval if interval is not None else ttl / 3
        hints = Hints(drop=rng.choice((0.0, 0.0, 0.3, 0.9)),
                      delay=round(pace * rng.choice((0.0, 0.01, 0.3, 1.5)), 3))
    return SwarmCase(nodes=nodes, shards=shards, seed=seed, lease_ttl=ttl, interval=interval,
                     margin=margin, max_concurrency=concurrency, renewal=mode,
                     faults=tuple(faults), kinds=chosen, origin=origin, hints=hints)


class _Drawer:
    def __init__(self, rng: random.Random, initial: list[str], names: list[str], shards: int,
                 ttl: float, interval: float, mode: Renewal) -> None:
        self.rng, self.initial, self.names, self.shards = rng, initial, names, shards
        self.ttl, self.interval = ttl, interval
        groups = sorted(CALL_GROUPS)
        self.groups, self.weights = groups, [GROUP_WEIGHTS[mode].get(g, 1.0) for g in groups]
        # The faults come one after another, from during the start or after
        # it, each a moment to a couple of TTLs after the one before: in the
        # order drawn, close enough to act together (a TTL cut, then a node's
        # epoch writes failing, then a leave while they do).
        self.cursor = round(interval * rng.choice((0.5, 2.0, 2.0, 4.0)), 1)
        self._kinds: dict[str, Callable[[], list[Fault]]] = {
            "crash": self.crash, "pause": self.pause, "store_all": self.store_all,
            "store_one": self.store_one, "lost_answers": self.lost_answers,
            "hot_key": self.hot_key,
            "stale": self.stale, "host": self.host, "join": self.join, "leave": self.leave,
            "handoff": self.handoff,
            "reconfigure_ttl": self.reconfigure_ttl,
            "reconfigure_interval": self.reconfigure_interval,
            "reconfigure_margin": self.reconfigure_margin, "corrupt": self.corrupt,
            "garbage": self.garbage, "deleted": self.deleted, "abort": self.abort,
            "refusal": self.refusal,
            "slow_stop": self.slow_stop, "blind_claim": self.blind_claim,
        }

    def draw(self, kind: str) -> list[Fault]:
        return self._kinds[kind]()

    # -- helpers ---------------------------------------------------------------------

    def at(self) -> float:
        gap = self.ttl * self.rng.choice((0.0, 0.05, 0.1, 0.2, 0.3, 0.6, 1.0, 2.0))
        self.cursor = round(self.cursor + gap * self.rng.uniform(0.5, 1.5), 1)
        return self.cursor

    def window(self) -> float:
        return round(self.ttl * self.rng.choice((0.3, 0.7, 1.0, 1.5, 2.0, 4.0)), 1)

    def node(self) -> str:
        return self.rng.choice(self.names)

    def node_or_all(self) -> str | None:
        return None if self.rng.random() < 0.3 else self.node()

    def calls(self) -> frozenset[str]:
        group = CALL_GROUPS[self.rng.choices(self.groups, self.weights)[0]]
        calls = self.rng.choice(group)
        if len(calls) > 1 and self.rng.random() < 0.3:
            calls = frozenset({self.rng.choice(sorted(calls))})  # one call of the group
        return calls

    # -- the kinds -------------------------------------------------------------------

    def crash(self) -> list[Fault]:
        return [Crash(self.at(), self.node())]

    def pause(self) -> list[Fault]:
        d = self.rng.choice((2.0, 0.3 * self.ttl, 0.7 * self.ttl, 1.5 * self.ttl, 3 * self.ttl))
        return [Pause(self.at(), self.node(), round(d, 1))]

    def store_all(self) -> list[Fault]:
        at, rng, t = self.at(), self.rng, self.ttl
        return [StoreFault(at, at + self.window(), node=self.node_or_all(),
                           latency=round(t * rng.choice((0.0, 0.0, 0.02, 0.1, 0.3)), 2),
                           jitter=round(t * rng.choice((0.0, 0.03, 0.1)), 2),
                           error_rate=rng.choice((0.0, 0.1, 0.5, 1.0)),
                           lost_reply_rate=rng.choice((0.0, 0.1, 0.3)),
                           # Half the delay on the answer's way back: a call
                           # given up on (a stop cancels a beat) may have landed.
                           reply_share=rng.choice((0.0, 0.5)))]

    def store_one(self) -> list[Fault]:
        at, rng = self.at(), self.rng
        return [StoreFault(at, at + self.window(), node=self.node_or_all(),
                           latency=round(self.ttl * rng.choice((0.0, 0.0, 0.05, 0.3)), 2),
                           error_rate=rng.choice((0.3, 0.7, 1.0, 1.0)),
                           lost_reply_rate=rng.choice((0.0, 0.0, 0.3, 1.0)),
                           calls=self.calls())]

    def lost_answers(self) -> list[Fault]:
        at, rng = self.at(), self.rng
        calls = None if rng.random() < 0.4 else self.calls()
        return [StoreFault(at, at + self.window(), node=self.node_or_all(),
                           lost_reply_rate=rng.choice((0.3, 0.7, 1.0)), calls=calls)]

    def hot_key(self) -> list[Fault]:
        """The store slow or failing for one or two leases only (a hot key, a
        partition of the store): their writes, or every call about them. Up
        to two TTLs of latency: a call that hangs past any budget."""
        at, rng, t = self.at(), self.rng, self.ttl
        keys = frozenset(rng.sample(range(self.shards), min(self.shards, rng.choice((1, 1, 2)))))
        return [StoreFault(at, at + self.window(), node=self.node_or_all(),
                           latency=round(t * rng.choice((0.0, 0.3, 0.7, 2.0)), 2),
                           error_rate=rng.choice((0.0, 0.0, 0.5, 1.0)),
                           lost_reply_rate=rng.choice((0.0, 0.0, 0.3)),
                           calls=rng.choice((LEASE_WRITES, None)), shards=keys,
                           reply_share=rng.choice((0.0, 0.5)))]

    def stale(self) -> list[Fault]:
        at = self.at()
        d = self.rng.choice((5.0, 1.5 * self.ttl, 4 * self.ttl))
        return [StoreFault(at, round(at + d, 1), node=self.node(), stale=True)]

    def host(self) -> list[Fault]:
        at, rng, t = self.at(), self.rng, self.ttl
        refuse = frozenset(rng.sample(range(self.shards), 1)) if rng.random() < 0.3 \
            else frozenset()
        return [HostFault(at, at + self.window(), node=self.node_or_all(),
                          open_latency=round(t * rng.choice((0.0, 0.1, 0.5, 1.3)), 2),
                          close_latency=round(t * rng.choice((0.0, 0.1, 0.3)), 2),
                          open_error_rate=rng.choice((0.0, 0.2, 0.6)),
                          close_error_rate=rng.choice((0.0, 0.2, 0.6)), refuse=refuse)]

    def join(self) -> list[Fault]:
        return [Join(self.at(), self.node(), self.rng.choice((0.0, 0.0, -300.0, 3600.0)))]

    def leave(self) -> list[Fault]:
        return [Leave(self.at(), self.node())]

    def handoff(self) -> list[Fault]:
        at, node = self.at(), self.node()
        hold = round(self.ttl * self.rng.choice((0.3, 1.0, 3.0)), 1)
        leave = Leave(at, node, hold=hold)
        if self.rng.random() < 0.3:
            return [leave]  # not back: the reservations lapse
        # Back before the hold ends (mostly), or just after it.
        back = round(at + hold * self.rng.choice((0.1, 0.5, 0.9, 1.2)), 1)
        return [leave, Join(back, node)]

    def corrupt(self) -> list[Fault]:
        return [Corrupt(self.at(), self.rng.randrange(self.shards),
                        self.rng.choice(READABLE_GENERATION))]

    def garbage(self) -> list[Fault]:
        return [Corrupt(self.at(), self.rng.randrange(self.shards), "garbage")]

    def deleted(self) -> list[Fault]:
        return [Corrupt(self.at(), self.rng.randrange(self.shards), "deleted")]

    def abort(self) -> list[Fault]:
        """A node stopped short while its application refuses or stalls its
        closes (mostly): what its way out frees must wait for the closes."""
        at, rng, t, node = self.at(), self.rng, self.ttl, self.node()
        faults: list[Fault] = []
        if rng.random() < 0.7:
            start = round(max(0.0, at - t * rng.choice((0.0, 0.1, 0.5))), 1)
            failing = rng.random() < 0.6
            faults.append(HostFault(start, round(at + t * rng.choice((0.5, 1.0, 3.0)), 1),
                                    node=node,
                                    close_latency=0.0 if failing else round(
                                        t * rng.choice((0.3, 1.0, 2.0)), 2),
                                    close_error_rate=1.0 if failing else 0.0))
        abort = Abort(at, node, rng.choice((*ABORTS, "loop")))
        if abort.what == "loop" and rng.random() < 0.5:
            # The second signal of a graceful stop.
            faults.append(Leave(round(max(0.0, at - t * rng.choice((0.05, 0.2, 0.5))), 1),
                                node))
        faults.append(abort)
        if rng.random() < 0.5:
            faults.append(Join(round(at + t * rng.choice((0.1, 0.5, 1.5)), 1), node))
        return faults

    def slow_stop(self) -> list[Fault]:
        at, rng, node = self.at(), self.rng, self.node()
        # calls.CALL_BUDGET is 0.95 of the interval.
        latency = round(self.interval * rng.choice((1.0, 1.1, 1.2)), 2)
        return [StoreFault(round(at - self.interval * rng.choice((0.0, 0.5)), 1),
                           round(at + self.ttl, 1), node=node, latency=latency),
                Leave(at, node)]

    def refusal(self) -> list[Fault]:
        at, rng, t, interval = self.at(), self.rng, self.ttl, self.interval
        faults: list[Fault] = [Corrupt(at, rng.randrange(self.shards), "deleted")]
        if rng.random() < 0.6:  # a node that never saw the record
            faults.append(Join(round(at + interval * rng.choice((0.0, 0.3, 1.0)), 1),
                               rng.choice(JOINERS)))
        how = rng.choice(("stop", "release", "handoff", "restart", "ttl_cut"))
        # Each node (a claimer, or not) at random.
        nodes = [n for n in self.names if rng.random() < 0.5] or [self.node()]
        def later() -> float:
            return round(at + interval * rng.choice((0.5, 1.0, 1.5, 2.5, 4.0)), 1)
        if how in ("stop", "release"):
            # Opens slow enough that a stop or a release comes during one.
            faults.append(HostFault(at, round(at + 6 * interval, 1), node=None,
                                    open_latency=round(interval * rng.choice((0.5, 1.0, 2.0)),
                                                       2)))
            if how == "stop":
                faults += [Leave(later(), n) for n in nodes]
            else:  # a node joins: the others release down to the new share
                faults.append(Join(later(), rng.choice(JOINERS)))
        elif how == "handoff":
            for n in nodes:
                leave = later()
                hold = round(t * rng.choice((0.1, 0.3, 0.6)), 1)
                faults += [Leave(leave, n, hold=hold),
                           Join(round(leave + hold * rng.choice((0.2, 0.5, 1.2)), 1), n)]
        elif how == "restart":
            for n in nodes:
                leave = later()
                faults += [Leave(leave, n),
                           Join(round(leave + interval * rng.choice((0.1, 0.5, 2.0)), 1), n)]
        else:  # the TTL cut in place, the owners' lease writes failing
            cut = rng.choice([x for x in NEW_TTLS if x < t] or [t])
            faults = [Reconfigure(round(max(0.0, at - interval), 1), None,
                                  (("lease_ttl", cut), ("interval", None), ("margin", None))),
                      StoreFault(at, round(at + 2 * t, 1), node=self.node_or_all(),
                                 error_rate=1.0, calls=LEASE_WRITES), *faults]
        if how != "ttl_cut" and rng.random() < 0.5:
            # A node blind to its record (the owner, perhaps: it keeps the
            # shard by its epoch, or until its deadline): its listings stale
            # and its calls about leases failing.
            blind = rng.choice([n for n in self.names if n not in nodes] or self.names)
            until = round(at + 2 * t, 1)
            faults += [StoreFault(at, until, node=blind, stale=True),
                       StoreFault(at, until, node=blind, error_rate=1.0,
                                  calls=frozenset({"get_lease", *LEASE_WRITES}))]
        return faults

    def blind_claim(self) -> list[Fault]:
        at, rng, t, interval = self.at(), self.rng, self.ttl, self.interval
        faults: list[Fault] = []
        until = round(at + 2 * t, 1)
        if rng.random() < 0.6:
            # The TTL cut in place: the owner, its lease writes failing, holds
            # by the old one, the blind claimer by the new.
            cut = rng.choice([x for x in NEW_TTLS if x < t] or [t])
            faults += [Reconfigure(round(max(0.0, at - interval), 1), None,
                                   (("lease_ttl", cut), ("interval", None), ("margin", None))),
                       StoreFault(at, until, node=self.node(), error_rate=1.0,
                                  calls=LEASE_WRITES)]
        else:
            # The owner blind to its record: it keeps the shard by its epoch,
            # or until its deadline.
            blind = self.node()
            faults += [StoreFault(at, until, node=blind, stale=True),
                       StoreFault(at, until, node=blind, error_rate=1.0,
                                  calls=frozenset({"get_lease", *LEASE_WRITES}))]
        claimer, other = rng.sample(JOINERS, 2)
        dies = round(at + interval * rng.choice((0.5, 1.0, 2.0, 3.0)), 1)
        # A few records, so that the claimer's share is likely to take one.
        deleted = rng.sample(range(self.shards), min(self.shards, rng.choice((1, 2, 4))))
        faults += [
            *(Corrupt(at, shard, "deleted") for shard in deleted),
            Join(round(at + interval * rng.choice((0.0, 0.1, 0.3)), 1), claimer),
            HostFault(at, round(at + 6 * interval, 1), node=claimer,
                      open_latency=round(interval * rng.choice((1.0, 2.0, 4.0)), 2)),
            Join(round(at + interval * rng.choice((0.0, 0.3, 1.0, 2.0)), 1), other),
            Crash(dies, claimer) if rng.random() < 0.5
            else Abort(dies, claimer, rng.choice(ABORTS))]
        return faults

    def reconfigure_ttl(self) -> list[Fault]:
        if self.rng.random() < 0.3:
            ttl, interval, margin = self.rng.choice(COMBOS)
            return self.rollout((("lease_ttl", ttl), ("interval", interval), ("margin", margin)))
        # The interval and margin follow the new TTL.
        ttl = self.rng.choice([t for t in NEW_TTLS if t != self.ttl])
        return self.rollout((("lease_ttl", ttl), ("interval", None), ("margin", None)))

    def reconfigure_interval(self) -> list[Fault]:
        # Valid with the base TTL and margin; after a TTL change it may not be
        # (the scenario records it as reconfigure_invalid and goes on).
        value = self.rng.choice((0.1, 0.2, 0.4, 0.6, None))
        return self.rollout((("interval", None if value is None
                              else round(self.ttl * value, 2)),))

    def reconfigure_margin(self) -> list[Fault]:
        value = self.rng.choice((0.05, 0.1, 0.3, 0.5, None))
        return self.rollout((("margin", None if value is None else round(self.ttl * value, 2)),))

    def rollout(self, changes: tuple[tuple[str, float | int | None], ...]) -> list[Fault]:
        """The same change on every node at once; or on one node (a canary)
        and the rest up to a few TTLs later; or on one, a few seconds later on
        another, then the rest; or on every node one by one with one of them a
        few seconds late (a rollout). Every change reaches every node in the
        end, and nodes that start later (a Reconfigure of node None is the
        cluster's spec): a node left on other options for good may see peers
        that beat at a slower pace as dead, which costs balance by design."""
        at, rng = self.at(), self.rng
        how = rng.choice(("all", "canary", "two", "rollout", "rollout"))
        if how == "all":
            return [Reconfigure(at, None, changes)]
        if how == "canary":
            rest = round(at + self.ttl * rng.choice((0.3, 1.0, 3.0)), 1)
            return [Reconfigure(at, self.node(), changes), Reconfigure(rest, None, changes)]
        if how == "two":
            first = self.node()
            second = rng.choice([n for n in self.names if n != first] or [first])
            then = round(at + rng.uniform(1, 10), 1)
            rest = round(then + self.ttl * rng.choice((0.3, 1.0, 3.0)), 1)
            return [Reconfigure(at, first, changes), Reconfigure(then, second, changes),
                    Reconfigure(rest, None, changes)]
        late = rng.choice(self.names)
        then = round(at + rng.uniform(1, 10), 1)
        return [*(Reconfigure(at, n, changes) for n in self.names if n != late),
                Reconfigure(then, late, changes),
                Reconfigure(then, None, changes)]  # (the spec, for the nodes to come)
