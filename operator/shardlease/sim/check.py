"""Invariant checks over a simulation trace (and the state at quiescence).

An *open interval* of a shard on a node runs from the host's `open` returning
successfully to the start of the `close` call that succeeded (a close that
fails leaves the shard open at the host), or to the node's crash. Deadlines
are the runner's, recorded at every claim and every renewal that moved them.

(a) exclusive:   two intervals of one shard on different nodes overlap only
                 if the older one's deadline (its latest, up to the end of the
                 overlap) had passed when the newer one opened;
(b) generations: the generations a host is asked to open, per shard and over
                 all nodes, strictly increase; except, once the shard's lease
                 record lost its generation (garbage, deleted) since its last
                 open, an ask the application does not accept (it refuses it
                 as outdated): only the application knows the generation
                 then, and the next ask must be above the last one opened
                 (by a host: an ask that never reached one does not count);
(c) quiescence:  every shard is open on exactly one live node, whose lease
                 (owner, incarnation, generation) it is, the loop holds what
                 its host has open, no live node has more than ceil(S/N), and
                 every live node's `lookup` routes every shard to its owner;
(d) recovery:    a crashed node's shards reopen elsewhere within
                 ttl + 2 intervals of the crash (checked by the scenario,
                 which knows which crashes happened in fault-free windows);
(e) fenced opens: no open completes after the shard's deadline;
(f) fenced on time: on a node without pauses or failing closes, the close of
                 every interval starts by the shard's deadline;
(g) departures:  a node that stopped gracefully left nothing open, no lease
                 and no heartbeat (checked by the world when the stop ends);
(h) host order:  per node and shard the host never gets two calls at once,
                 and never a second open before a close;
(i) fences are reported: a shard closed for a fence had a SelfFence event;
(j) close before free: a node frees a lease only once its host has closed
                 the shard; one its host may still have open (a close
                 given up after a fence, or cut short by an abort) only
                 once the lease expired in its eyes (deadline + margin);
(k) fences are announced: a self_fence of a shard comes after a renew_slow
                 of it, since the last claim or renewal that set its deadline;
(l) fencing ends in time: the runner is done with a fenced shard (closed,
                 or its close abandoned) by the fence's deadline + margin, when
                 another node may take the lease (`check_fenced_closes`);
(m) open somewhere: no shard stays open on no node for longer than
                 `liveness_bound` (4 TTLs + 6 intervals, the largest any node
                 had) of a time during which some node worked throughout:
                 running (not leaving), not paused, no store fault and no host
                 fault acting on it. Nor does the time count that a node not
                 working had the shard to open (claimed; its host slow, or it
                 paused): the open is under way. A node whose lease writes
                 fail is no working node, nor one whose host refuses or fails
                 opens. Checked up to quiescence (`check_open_somewhere`).
(n) counted:     a node counts every peer that worked throughout the last
                 2 TTLs + 3 intervals (as in (m); nothing reconfigured, no
                 node's options apart from its peers'), if it
                 worked itself for 1.5 intervals of that time and its reads
                 were never stale in it: a read that fails later must never
                 make it count fewer (finding D: a failed epoch listing made
                 a node think itself alone and claim every shard)
                 (`check_counted`).
(o) fences have a cause: a node fences a shard only if something acted on
                 that node and that lease in the TTL + 2 intervals before:
                 a pause, a store fault on its calls about that lease, a
                 host fault, a corruption of the record, a change of options
                 (`check_fences_caused`).
Also: the runner gives up on a close that keeps failing only after a fence.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shardlease.sim.faults import Corrupt, Fault, HostFault, Reconfigure, StoreFault, fault_end
from shardlease.sim.world import Snapshot, TraceEvent

#: Times within this are the same instant (float rounding of virtual time).
EPSILON = 1e-9


@dataclass
class Interval:
    node: str
    shard: int
    generation: int
    start_i: int
    start_t: float
    end_i: int = -1
    end_t: float = math.inf
    ended_by: str = ""  # close, crash, reopen, end
    abandoned_i: int | None = None  # the runner gave up closing it (after a fence)


@dataclass
class Recovery:
    """A crash and how long until every lease it held was open elsewhere."""

    node: str
    at: float
    shards: tuple[int, ...]
    seconds: float | None  # None: some shard never reopened before the end


@dataclass
class Deadlines:
    by_key: dict[tuple[str, int], tuple[list[int], list[float]]] = field(default_factory=dict)

    def add(self, node: str, shard: int, index: int, value: float) -> None:
        idx, vals = self.by_key.setdefault((node, shard), ([], []))
        idx.append(index)
        vals.append(value)

    def at(self, node: str, shard: int, index: int) -> float | None:
        """The deadline last recorded for (node, shard) before trace index `index`."""
        found = self.by_key.get((node, shard))
        if found is None:
            return None
        pos = bisect.bisect_left(found[0], index)
        return found[1][pos - 1] if pos else None


def deadlines(trace: Sequence[TraceEvent]) -> Deadlines:
    d = Deadlines()
    for i, ev in enumerate(trace):
        if ev.kind == "deadline":
            d.add(ev.node, ev.shard, i, ev.value)
    return d


def intervals(trace: Sequence[TraceEvent]) -> list[Interval]:
    out: list[Interval] = []
    current: dict[tuple[str, int], Interval] = {}
    closing: dict[tuple[str, int], tuple[int, float]] = {}
    end_i, end_t = len(trace), (trace[-1].t if trace else 0.0)
    for i, ev in enumerate(trace):
        key = (ev.node, ev.shard)
        iv: Interval | None
        match ev.kind:
            case "open_ok":
                if (old := current.pop(key, None)) is not None:
                    old.end_i, old.end_t, old.ended_by = i, ev.t, "reopen"
                new = Interval(ev.node, ev.shard, ev.generation, i, ev.t)
                current[key] = new
                out.append(new)
            case "close_call":
                closing[key] = (i, ev.t)
            case "close_ok":
                start = closing.pop(key, (i, ev.t))
                if (iv := current.pop(key, None)) is not None:
                    iv.end_i, iv.end_t, iv.ended_by = start[0], start[1], "close"
            case "close_err" | "close_cancel":
                closing.pop(key, None)
            case "abandoned":
                if (iv := current.get(key)) is not None:
                    iv.abandoned_i = i
            case "crash":
                for k in [k for k in current if k[0] == ev.node]:
                    dead = current.pop(k)
                    dead.end_i, dead.end_t, dead.ended_by = i, ev.t, "crash"
            case _:
                pass
    for iv in current.values():
        iv.end_i, iv.end_t, iv.ended_by = end_i, end_t, "end"
    return out


def check_exclusive(trace: Sequence[TraceEvent]) -> list[str]:
    """(a)"""
    dl = deadlines(trace)
    by_shard: dict[int, list[Interval]] = defaultdict(list)
    for iv in intervals(trace):
        by_shard[iv.shard].append(iv)
    problems = []
    for shard, ivs in sorted(by_shard.items()):
        ivs.sort(key=lambda iv: iv.start_i)
        for j, y in enumerate(ivs):
            for x in ivs[:j]:
                if x.node == y.node or not x.start_i < y.start_i < x.end_i:
                    continue
                upto = min(x.end_i, y.end_i)
                if x.abandoned_i is not None:
                    upto = min(upto, x.abandoned_i)
                d = dl.at(x.node, shard, upto)
                if d is None or d > y.start_t + EPSILON:
                    problems.append(
                        f"(a) shard {shard}: open on {y.node} (generation {y.generation}) at "
                        f"{y.start_t:.3f} while still open on {x.node} (generation "
                        f"{x.generation}, deadline {d}) until {x.end_t:.3f}")
    return problems


def check_generations(trace: Sequence[TraceEvent]) -> list[str]:
    """(b)"""
    last: dict[int, tuple[int, str, float]] = {}
    problems = []
    #: Shards whose record lost its generation since their last open (asked
    #: after the loss: an open asked before it and done after it was asked
    #: with a generation the record still showed), and when it was lost.
    lost: dict[int, int] = {}
    #: (node, shard) -> the trace index of its last claim: the write that
    #: put its generation in the record.
    claims: dict[tuple[str, int], int] = {}
    #: (node, shard) -> the problem an ask after such a loss is, if it opens.
    asked: dict[tuple[str, int], str] = {}
    #: Per shard, the highest generation a host opened (not just was asked).
    opened: dict[int, int] = {}
    for i, ev in enumerate(trace):
        match ev.kind:
            case "corrupted" if ev.generation < 0:
                lost[ev.shard] = i
            case "deadline" if ev.detail == "claim":
                claims[(ev.node, ev.shard)] = i
            case "open_ok":
                opened[ev.shard] = max(ev.generation, opened.get(ev.shard, -1))
                # The record shows the generation again only if the claim of
                # this open was written after the loss: an open asked after
                # it on a claim from before (a queued open of a node blind to
                # the deletion) leaves it lost (explorer seed 2438274690).
                if claims.get((ev.node, ev.shard), -1) > lost.get(ev.shard, len(trace)):
                    del lost[ev.shard]
                if (problem := asked.pop((ev.node, ev.shard), None)) is not None:
                    problems.append(problem)
            case "open_err" | "open_cancel":
                asked.pop((ev.node, ev.shard), None)
            case "open_call":
                prev = last.get(ev.shard)
                if prev is None or ev.generation > prev[0]:
                    last[ev.shard] = (ev.generation, ev.node, ev.t)
                    continue
                problem = (f"(b) shard {ev.shard}: {ev.node} asked to open generation "
                           f"{ev.generation} at {ev.t:.3f} after {prev[1]} opened generation "
                           f"{prev[0]} at {prev[2]:.3f}")
                if ev.shard in lost:
                    # Only the application knows the generation now: what it
                    # opened, not what it was asked (an ask cancelled on its
                    # way, a slow open fenced, never reached it). An ask at or
                    # below that must be refused; above it, it is the next.
                    if ev.generation <= opened.get(ev.shard, -1):
                        asked[(ev.node, ev.shard)] = problem
                    else:
                        last[ev.shard] = (ev.generation, ev.node, ev.t)
                else:
                    problems.append(problem)
    return problems


def check_deadlines(trace: Sequence[TraceEvent]) -> list[str]:
    """(e) and (f)"""
    dl = deadlines(trace)
    exempt = {ev.node for ev in trace if ev.kind in ("pause", "close_err")}
    problems = []
    for i, ev in enumerate(trace):
        if ev.kind == "open_ok":
            d = dl.at(ev.node, ev.shard, i)
            if d is None or ev.t > d + EPSILON:
                problems.append(f"(e) shard {ev.shard}: {ev.node} finished opening generation "
                                f"{ev.generation} at {ev.t:.3f}, after its deadline {d}")
    for iv in intervals(trace):
        if iv.node in exempt or iv.ended_by not in ("close", "reopen") \
                or iv.abandoned_i is not None:
            continue
        d = dl.at(iv.node, iv.shard, iv.end_i)
        if d is None or iv.end_t > d + EPSILON:
            problems.append(f"(f) shard {iv.shard}: {iv.node} started closing generation "
                            f"{iv.generation} at {iv.end_t:.3f}, after its deadline {d}")
    return problems


def check_host_order(trace: Sequence[TraceEvent]) -> list[str]:
    """(h), and abandoned closes only after a fence."""
    in_flight: dict[tuple[str, int], str] = {}
    needs_close: set[tuple[str, int]] = set()
    problems = []
    for ev in trace:
        key = (ev.node, ev.shard)
        match ev.kind:
            case "open_call" | "close_call":
                if key in in_flight:
                    problems.append(f"(h) {ev.node} shard {ev.shard}: {ev.kind} at {ev.t:.3f} "
                                    f"while its {in_flight[key]} is running")
                if ev.kind == "open_call" and key in needs_close:
                    problems.append(f"(h) {ev.node} shard {ev.shard}: opened again at "
                                    f"{ev.t:.3f} without a close")
                in_flight[key] = ev.kind.removesuffix("_call")
                if ev.kind == "open_call":
                    needs_close.add(key)
                else:
                    needs_close.discard(key)
            case "open_ok" | "open_err" | "open_cancel" | "close_ok" | "close_err" \
                    | "close_cancel":
                in_flight.pop(key, None)
            case "abandoned" if ev.detail not in ("fenced", "aborted"):
                problems.append(f"(h) {ev.node} shard {ev.shard}: the runner finished "
                                f"({ev.detail}) at {ev.t:.3f} while the host still has it open")
            case _:
                pass
    return problems


def check_release_and_fence(trace: Sequence[TraceEvent]) -> list[str]:
    """(i) a shard closed for a fence was reported in a SelfFence event;
    (j) a lease is freed (release) only while the node's host has the shard
    closed -- or open but abandoned (a fenced close that kept failing, a
    close an abort cut short), once its lease has expired in the node's eyes
    (the abandonment's `value`): before that a peer would open it beside a
    host that may still act on it."""
    reported: set[tuple[str, int]] = set()
    #: -> None while open, or when its lease expires once abandoned.
    open_at_host: dict[tuple[str, int], float | None] = {}
    problems = []
    for ev in trace:
        key = (ev.node, ev.shard)
        match ev.kind:
            case "deadline" if ev.detail == "claim":
                reported.discard(key)
            case "self_fence":
                reported.add(key)
            case "closed" if ev.detail == "fenced" and key not in reported:
                problems.append(f"(i) {ev.node} shard {ev.shard}: closed for a fence at "
                                f"{ev.t:.3f} with no self_fence event")
            case "open_ok":
                open_at_host[key] = None
            case "close_ok":
                open_at_host.pop(key, None)
            case "abandoned":
                if key in open_at_host:
                    open_at_host[key] = ev.value
            case "crash":
                for k in [k for k in open_at_host if k[0] == ev.node]:
                    del open_at_host[k]
            case "release" if key in open_at_host:
                expiry = open_at_host[key]
                if expiry is None:
                    problems.append(f"(j) {ev.node} shard {ev.shard}: lease freed at "
                                    f"{ev.t:.3f} while its host still has the shard open")
                elif ev.t < expiry - EPSILON:
                    problems.append(f"(j) {ev.node} shard {ev.shard}: lease freed at "
                                    f"{ev.t:.3f}, before its expiry at {expiry:.3f}, while "
                                    f"its host may still have the shard open (its close "
                                    f"failed or was cut short)")
            case _:
                pass
    return problems


def check_announced(trace: Sequence[TraceEvent]) -> list[str]:
    """(k)"""
    warned: set[tuple[str, int]] = set()
    problems = []
    for ev in trace:
        key = (ev.node, ev.shard)
        match ev.kind:
            case "deadline":
                warned.discard(key)
            case "renew_slow":
                warned.add(key)
            case "self_fence" if key not in warned:
                problems.append(f"(k) {ev.node} shard {ev.shard}: self-fenced at {ev.t:.3f} "
                                f"with no renew_slow before")
            case _:
                pass
    return problems


def check_fenced_closes(trace: Sequence[TraceEvent],
                        margin: float | Callable[[str, int, int], float | None]) -> list[str]:
    """(l). `margin`: one for every deadline, or the margin the runner gave
    the deadline of (node, shard) in force at trace index i (a Reconfigure
    changes the margin of the deadlines given from then on only, and a
    lease's expiry is its deadline plus that margin)."""
    margin_at = margin if callable(margin) else (lambda node, shard, i: margin)
    dl = deadlines(trace)
    fenced: dict[tuple[str, int], tuple[float, float]] = {}  # -> the deadline missed, margin
    problems = []
    for i, ev in enumerate(trace):
        key = (ev.node, ev.shard)
        match ev.kind:
            case "self_fence":
                d = dl.at(ev.node, ev.shard, i)
                m = margin_at(ev.node, ev.shard, i)
                if d is not None and m is not None:
                    fenced[key] = (d, m)
            case "closed" if key in fenced:
                d, m = fenced.pop(key)
                if ev.t > d + m + EPSILON:
                    problems.append(f"(l) {ev.node} shard {ev.shard}: fenced at {d:.3f} but "
                                    f"closed only at {ev.t:.3f}, after {d + m:.3f} when "
                                    f"its lease could be taken (margin {m:g})")
            case "crash":
                for k in [k for k in fenced if k[0] == ev.node]:
                    del fenced[k]
            case _:
                pass
    return problems


def check_trace(trace: Sequence[TraceEvent]) -> list[str]:
    return (check_exclusive(trace) + check_generations(trace) + check_deadlines(trace)
            + check_host_order(trace) + check_release_and_fence(trace)
            + check_announced(trace))


def check_quiescence(snap: Snapshot, shards: int) -> list[str]:
    """(c)"""
    if not snap.live:
        return []
    problems = []
    share = math.ceil(shards / len(snap.live))
    where = f"(c) at {snap.t:.3f}"
    for s in range(shards):
        holders = [label for label, opened in snap.open.items() if s in opened]
        if len(holders) != 1:
            problems.append(f"{where}: shard {s} is open on {holders or 'no live node'}")
            continue
        label = holders[0]
        lease = snap.leases.get(s)
        if lease is None or lease.owner != snap.live[label] \
                or lease.incarnation != snap.incarnations[label] \
                or lease.generation != snap.open[label][s]:
            problems.append(f"{where}: shard {s} is open on {label} (generation "
                            f"{snap.open[label][s]}) but its lease is {lease}")
        for other, routes in snap.lookups.items():
            if routes[s] != snap.live[label]:
                problems.append(f"{where}: {other} routes shard {s} to {routes[s]}, "
                                f"not to {snap.live[label]}")
    for label, opened in snap.open.items():
        if len(opened) > share:
            problems.append(f"{where}: {label} has {len(opened)} shards open, more than "
                            f"ceil({shards}/{len(snap.live)}) = {share}")
        if set(opened) != snap.held[label]:
            problems.append(f"{where}: {label} holds leases {sorted(snap.held[label])} "
                            f"but has {sorted(opened)} open")
    return problems


def recoveries(trace: Sequence[TraceEvent]) -> list[Recovery]:
    """(d)'s figure: per crash, time until every lease it held was open elsewhere."""
    out = []
    for i, ev in enumerate(trace):
        if ev.kind != "crash":
            continue
        shards = tuple(int(s) for s in ev.detail.split(",") if s)
        pending = set(shards)
        last = ev.t
        for later in trace[i + 1:]:
            if not pending:
                break
            if later.kind == "open_ok" and later.node != ev.node and later.shard in pending:
                pending.discard(later.shard)
                last = later.t
        out.append(Recovery(ev.node, ev.t, shards, None if pending else last - ev.t))
    return out


# -- (m) -------------------------------------------------------------------------------

#: (m)'s bound, in the largest TTL and interval any node had. A shard its
#: owner closed but could not free waits for its lease to expire (a TTL; node
#: mode: the owner gives up its epoch a TTL after the close, and the epoch is
#: then silent for a TTL), then to be free for a TTL before a node at its
#: share adopts it, one a round, plus a few rounds (reads, a claim, an open).
#: In 3000 swarm cases of the unpatched tree (both modes, no corrupt records)
#: the longest stretch was 2.2 TTLs + 6 intervals (node mode: the leases of
#: an epoch a node ended are adopted only two TTLs after the end, their
#: free time counting from the end's own write); finding E's case with its
#: node-mode fix taken out (tests/sim/mutants), 7.2 TTLs + 6 intervals.
LIVENESS_TTLS = 4.0
LIVENESS_INTERVALS = 6.0


def liveness_bound(ttl: float, interval: float) -> float:
    """(m)'s bound for the largest TTL and interval configured."""
    return LIVENESS_TTLS * ttl + LIVENESS_INTERVALS * interval


@dataclass(frozen=True)
class Stretch:
    """A time a shard was open on no node while some node worked throughout."""

    shard: int
    start: float  # open nowhere since (0: never opened yet)
    end: float  # until (its next open, or the end of the time checked)
    worked_from: float  # some node worked throughout [worked_from, worked_to)
    worked_to: float
    workers: tuple[str, ...]  # the nodes working when the overlap began

    @property
    def seconds(self) -> float:
        return min(self.end, self.worked_to) - max(self.start, self.worked_from)


def _subtract(spans: list[tuple[float, float]], cut: tuple[float, float]) \
        -> list[tuple[float, float]]:
    a, b = cut
    out = []
    for s, e in spans:
        if b <= s or a >= e:
            out.append((s, e))
            continue
        if s < a:
            out.append((s, a))
        if b < e:
            out.append((b, e))
    return out


def working_spans(trace: Sequence[TraceEvent], faults: Sequence[Fault],
                  until: float) -> dict[str, list[tuple[float, float]]]:
    """(m): per node label, the times in [0, until) it worked: from its start
    to its crash, leave or death, less its pauses and every store or host
    fault acting on it (from the fault's start to `faults.fault_end`)."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    cuts: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for ev in trace:
        match ev.kind:
            case "start":
                starts.setdefault(ev.node, ev.t)
            case "crash" | "leave" | "died" | "left" | "abort":
                ends.setdefault(ev.node, ev.t)
            case "pause":
                cuts[ev.node].append((ev.t, ev.value))
            case _:
                pass
    windows = [(f.node, f.at, fault_end(f)) for f in faults
               if isinstance(f, StoreFault | HostFault)]
    out: dict[str, list[tuple[float, float]]] = {}
    for label, t0 in starts.items():
        name = label.split("#")[0]
        spans = [(t0, min(ends.get(label, until), until))]
        for cut in cuts[label] + [(a, b) for n, a, b in windows if n in (None, name)]:
            spans = _subtract(spans, cut)
        out[label] = [(s, e) for s, e in spans if e > s]
    return out


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def open_nowhere(trace: Sequence[TraceEvent], shards: int,
                 until: float) -> dict[int, list[tuple[float, float]]]:
    """Per shard, the times in [0, until) it was open at no node's host (from
    the start of a close that succeeded, a crash or an abandoned close, to the
    next successful open anywhere)."""
    opened: dict[int, set[str]] = {s: set() for s in range(shards)}
    since: dict[int, float] = dict.fromkeys(range(shards), 0.0)
    closing: dict[tuple[str, int], float] = {}
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)

    def drop(node: str, shard: int, t: float) -> None:
        if node in opened[shard]:
            opened[shard].discard(node)
            if not opened[shard]:
                since[shard] = t

    for ev in trace:
        if ev.t >= until:
            break
        if ev.kind == "crash":
            for s in range(shards):
                drop(ev.node, s, ev.t)
            continue
        if not 0 <= ev.shard < shards:
            continue
        key = (ev.node, ev.shard)
        match ev.kind:
            case "open_ok":
                if not opened[ev.shard]:
                    out[ev.shard].append((since.pop(ev.shard), ev.t))
                opened[ev.shard].add(ev.node)
            case "close_call":
                closing[key] = ev.t
            case "close_ok":
                drop(ev.node, ev.shard, closing.pop(key, ev.t))
            case "close_err" | "close_cancel":
                closing.pop(key, None)
            case "abandoned":
                drop(ev.node, ev.shard, ev.t)
            case _:
                pass
    for s, t in since.items():
        if not opened[s]:
            out[s].append((t, until))
    return out


def pending_opens(trace: Sequence[TraceEvent],
                  until: float) -> dict[int, list[tuple[str, float, float]]]:
    """Per shard, each (node, from, to) during which a node's runner had the
    shard to open: from its claim to the open's success, or the runner's
    close of it (a failed open, a release, a loss), or the node's crash."""
    started: dict[tuple[str, int], float] = {}
    out: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    for ev in trace:
        if ev.t >= until:
            break
        key = (ev.node, ev.shard)
        match ev.kind:
            case "deadline" if ev.detail == "claim":
                started.setdefault(key, ev.t)
            case "open_ok" | "closed" if key in started:
                out[ev.shard].append((ev.node, started.pop(key), ev.t))
            case "crash":
                for k in [k for k in started if k[0] == ev.node]:
                    out[k[1]].append((ev.node, started.pop(k), ev.t))
            case _:
                pass
    for (node, shard), t in started.items():
        out[shard].append((node, t, until))
    return out


def stretches(trace: Sequence[TraceEvent], shards: int, faults: Sequence[Fault],
              until: float) -> list[Stretch]:
    """(m)'s figures: every overlap of a shard open nowhere with a time some
    node worked throughout, longest first. The time a node that did not work
    had the shard to open (its host slow, a pause) does not count: the shard
    is its to open, and the open is under way. (`worked_from`, `worked_to`:
    the time that counts around the overlap.)"""
    spans = working_spans(trace, faults, until)
    worked = _union([sp for v in spans.values() for sp in v])
    pending = pending_opens(trace, until)
    out = []
    for shard, gaps in open_nowhere(trace, shards, until).items():
        counted = worked
        for node, a, b in pending.get(shard, ()):
            idle = [(a, b)]  # the part of [a, b) the node did not work
            for sp in spans.get(node, ()):
                idle = [piece for cut in idle for piece in _subtract([cut], sp)]
            for cut in idle:
                counted = _subtract(counted, cut)
        for a, b in gaps:
            for w0, w1 in counted:
                if w1 <= a or w0 >= b:
                    continue
                at = max(a, w0)
                workers = tuple(label for label, v in spans.items()
                                if any(s <= at < e for s, e in v))
                out.append(Stretch(shard, a, b, w0, w1, workers))
    out.sort(key=lambda st: -st.seconds)
    return out


def check_open_somewhere(trace: Sequence[TraceEvent], shards: int, faults: Sequence[Fault],
                         until: float, bound: float) -> list[str]:
    """(m)"""
    problems = []
    for st in stretches(trace, shards, faults, until):
        if st.seconds > bound + EPSILON:
            end = "" if st.end < until else " (still at quiescence)"
            problems.append(
                f"(m) shard {st.shard}: open on no node from {st.start:.3f} to {st.end:.3f}"
                f"{end}, {st.seconds:.1f}s of it while {', '.join(st.workers)} worked "
                f"(some node throughout [{st.worked_from:.3f}, {st.worked_to:.3f})), "
                f"longer than {bound:g}s")
    return problems


#: (n)'s window, in TTLs and intervals (the largest any node had).
COUNTED_TTLS, COUNTED_INTERVALS = 2.0, 3.0


def check_counted(trace: Sequence[TraceEvent], faults: Sequence[Fault], until: float,
                  ttl: float, interval: float) -> list[str]:
    """(n)"""
    window = COUNTED_TTLS * ttl + COUNTED_INTERVALS * interval
    spans = working_spans(trace, faults, until)
    stale = [(f.node, f.at, fault_end(f)) for f in faults
             if isinstance(f, StoreFault) and f.stale]
    changes = [ev.t for ev in trace if ev.kind == "reconfigure"]
    # While one node's options differ from its peers' (a canary, until the
    # change reaches every node), liveness is judged differently across
    # nodes: not checked.
    mixed: list[tuple[float, float]] = []
    begun: float | None = None
    for f in sorted((f for f in faults if isinstance(f, Reconfigure)), key=lambda f: f.at):
        if f.node is not None and begun is None:
            begun = f.at
        elif f.node is None and begun is not None:
            mixed.append((begun, f.at))
            begun = None
    if begun is not None:
        mixed.append((begun, math.inf))
    # A change some node refused leaves the nodes apart for good.
    mixed += [(ev.t, math.inf) for ev in trace if ev.kind == "reconfigure_refused"]
    ends: dict[str, float] = {}  # (the first: a leave, then its left)
    for ev in trace:
        if ev.kind in ("crash", "leave", "died", "left", "abort"):
            ends.setdefault(ev.node, ev.t)
    problems: list[str] = []
    for ev in trace:
        if ev.kind != "round" or (ev.node in ends and ends[ev.node] <= ev.t + EPSILON):
            continue
        t = ev.t - ev.value  # when the round read (it is recorded at its end)
        a = t - window
        if a < 0 or any(a <= c <= ev.t for c in changes) \
                or any(s < ev.t and e > a for s, e in mixed) or any(
                n in (None, ev.node.split("#")[0]) and s < t and e > a for n, s, e in stale):
            continue
        worked = sum(max(0.0, min(e, t) - max(s, a)) for s, e in spans.get(ev.node, []))
        if worked < 1.5 * interval:
            continue
        # (A peer that stops, crashes or leaves at this very instant may be
        # gone already: not counted.)
        peers = sorted(label for label, ss in spans.items() if label != ev.node
                       and not (label in ends and ends[label] <= ev.t + EPSILON)
                       and any(s <= a + EPSILON and e >= ev.t - EPSILON for s, e in ss))
        # It counts itself too unless it withdrew (its lease writes failing:
        # not while it worked throughout).
        mine = any(s <= a + EPSILON and e >= ev.t - EPSILON for s, e in spans.get(ev.node, []))
        live = int(ev.detail.split()[0].removeprefix("live="))
        if live < len(peers) + mine:
            problems.append(f"(n) at {ev.t:.3f}: {ev.node} counted {live} live node(s), "
                            f"fewer than the {len(peers)} that worked throughout "
                            f"[{a:.3f}, {ev.t:.3f}]: {', '.join(peers)}")
            break  # one is enough to tell
    return problems


# -- (o) -------------------------------------------------------------------------------

#: (o)'s window before a fence, in TTLs and intervals (the largest any node
#: had): the deadline missed was set by a claim or renewal at most a TTL
#: before it, and what kept the next renewal from landing acted since then.
CAUSE_TTLS, CAUSE_INTERVALS = 1.0, 2.0


def check_fences_caused(trace: Sequence[TraceEvent], faults: Sequence[Fault],
                        ttl: float, interval: float) -> list[str]:
    """(o) a node fences a shard only for a cause that acted on that node and
    that shard in the window before the fence: a pause of the node, a store
    fault on its calls about that shard's lease (all its calls, or the
    shard's), a host fault on it, a corruption of that shard's record, or a
    change of options (any node's). A fault on another shard's lease is no
    cause: a renewal that waits on another shard's call is one that a
    healthy store could have answered (the a55dbba bug: a free that hung on
    a hot key held up the renewals of every other shard of its node)."""
    window = CAUSE_TTLS * ttl + CAUSE_INTERVALS * interval
    pauses: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for ev in trace:
        if ev.kind == "pause":
            pauses[ev.node].append((ev.t, ev.value))
    changes = [ev.t for ev in trace if ev.kind.startswith("reconfigure")]
    problems = []
    for ev in trace:
        if ev.kind != "self_fence":
            continue
        a, t, name = ev.t - window, ev.t, ev.node.split("#")[0]
        spans = list(pauses[ev.node]) + [(c, c) for c in changes]
        for f in faults:
            match f:
                case StoreFault(node=node, shards=shards) if node in (None, name) and (
                        shards is None or ev.shard in shards):
                    spans.append((f.at, fault_end(f)))
                case HostFault(node=node) if node in (None, name):
                    spans.append((f.at, fault_end(f)))
                case Corrupt(shard=shard) if shard == ev.shard:
                    spans.append((f.at, f.at))
                case _:
                    pass
        caused = any(s <= t + EPSILON and e >= a - EPSILON for s, e in spans)
        if not caused:
            problems.append(f"(o) {ev.node} shard {ev.shard}: self-fenced at {t:.3f} with "
                            f"nothing acting on that node and shard since {a:.3f} (no pause, "
                            f"no store fault on its calls about that lease, no host fault, "
                            f"no corruption, no change of options)")
    return problems
