"""A deterministic simulation of shardlease: the real `PlacementLoop` and
`Runner`, several nodes in one virtual-time event loop against one
`MemoryBackend`, with injected faults, a recording host, and invariant checks.

    from shardlease.sim import (run_scenario, Crash, Pause, StoreFault, HostFault, Join, Leave,
                                Reconfigure, Corrupt)

    result = run_scenario(
        nodes=3,                 # initial nodes n0..n{nodes-1}, started within the first interval
        shards=16,
        seed=0,                  # same seed, same trace (ScenarioResult.trace)
        lease_ttl=15.0, interval=None, margin=None,   # Options; None = the defaults (ttl/3, ttl/6)
        max_concurrency=16, open_timeout=60.0, close_timeout=60.0,
        faults=[                 # times are virtual seconds from the start
            Crash(at=60, node="n1"),
            Pause(at=90, node="n2", duration=40),
            StoreFault(at=100, until=130, node=None, latency=0.5, jitter=1.0,
                       error_rate=0.2, lost_reply_rate=0.1,
                       calls=None),      # or some of STORE_CALLS (e.g. STORE_CALLS - LEASE_WRITES)
            HostFault(at=100, until=130, node="n0", open_latency=2.0, close_latency=1.0,
                      open_error_rate=0.3, close_error_rate=0.3,
                      refuse=frozenset({3})),   # opens of shard 3 always fail there
            Join(at=140, node="n3", wall_skew=-300.0),   # a new node
            Join(at=145, node="n1"),     # the crashed n1 restarts: label "n1#1"
            Leave(at=150, node="n0"),    # graceful stop()
            Reconfigure(at=160, node=None,   # options changed in place (None: every node,
                        changes=(("lease_ttl", 90.0),)),   # and the nodes that start later)
            Corrupt(at=170, shard=5, how="garbage"),   # the lease record overwritten
                                         # (or "truncated", "invalid": see faults.Corrupt)
        ],                         # a fault naming a node not running is ignored
        wall_skews={"n0": 120.0},  # per initial node
        settle=None,               # after the last fault; default 2*ttl + 4*interval
        recovery_bound=None,       # (d)'s bound; default ttl + 2*interval
                                   # (both with the largest TTL and interval configured)
        quiet=True,                # the "shardlease" logger at CRITICAL while it runs
    ) -> ScenarioResult

The initial nodes start at seeded times within the first interval. After
the settle time the state is checked for quiescence, then every node stops
gracefully (and is checked for what it left behind). `ScenarioResult` has:

- `ok`, `violations`: the invariants broken (see `shardlease.sim.check`);
- `recovery`: per crash, `Recovery(node, at, shards, seconds)`: the time from
  the crash until every lease it held was open on another node (None: never);
  `recovery_seconds()` lists just the seconds;
- `balance`: `BalanceFigure(kind, node, at, seconds, rounds)` for the start
  (from t=0), every join, leave and crash: time until the placement was
  balanced for good before the next fault (None if it was not), and that in
  rounds (ceil(seconds / interval));
- `requests` (per node label, per kind list/get/put/delete, counted on its
  store: `stores.requests`), `rounds` (per node), `requests_per_round` (per node),
  `request_times` (per node, the virtual time of every request) and
  `requests_between(node, t0, t1)`;
- `counts`: claim, release, lost, self_fence, renew_failed, renew_slow, abandoned,
  overrun,
  left_behind (leases or heartbeat a stop under store failures left to
  expire), open_err, close_err, crash, pause, leave, start; `claims`,
  `releases`;
- `end` (virtual seconds), `real_seconds`, `trace` (`TraceEvent`s),
  `quiescence` (the `Snapshot` checked), `figures()` (JSON-friendly),
  `format_trace()`.

Swarm testing (`shardlease.sim.swarm`): `draw_case(rng)` draws a `SwarmCase`
(sizes, options, renewal mode and up to six faults of a random subset of the
fault kinds, `swarm.KINDS`) from a `random.Random`; `case_for(seed)` is the
case of a seed, the same in every process; `SwarmCase.run()` runs it. The
explorer, `python -m shardlease.sim.explore`, runs such cases until a time
budget is spent and prints the seed of each one that breaks an invariant
(see its docstring).

Lower layers: `vloop.VirtualTimeLoop` / `run_virtual` (the virtual clock),
`world.World` (nodes, faulty stores, recording hosts, crash and pause models:
read its docstring), `check` (the invariants).
"""

from shardlease.sim.check import Recovery
from shardlease.sim.faults import (
    LEASE_WRITES,
    STORE_CALLS,
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
from shardlease.sim.scenario import BalanceFigure, ScenarioResult, run_scenario
from shardlease.sim.swarm import SwarmCase, case_for, draw_case
from shardlease.sim.vloop import SimulationStuck, VirtualTimeLoop, run_virtual
from shardlease.sim.world import TraceEvent

__all__ = [
    "LEASE_WRITES",
    "STORE_CALLS",
    "Abort",
    "BalanceFigure",
    "Corrupt",
    "Crash",
    "Fault",
    "Hints",
    "HostFault",
    "Join",
    "Leave",
    "Pause",
    "Reconfigure",
    "Recovery",
    "ScenarioResult",
    "SimulationStuck",
    "StoreFault",
    "SwarmCase",
    "TraceEvent",
    "VirtualTimeLoop",
    "case_for",
    "draw_case",
    "run_scenario",
    "run_virtual",
]
