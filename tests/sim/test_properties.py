"""Property tests: random seeds, sizes and fault schedules; every invariant of
shardlease.sim.check must hold in every one (see the checks' docstring).

The swarm test draws its cases with `shardlease.sim.swarm` (a random subset
of the fault kinds, then up to six faults of those kinds: combinations such
as a TTL cut in place while one call kind fails), from a seed, the same
cases `python -m shardlease.sim.explore` runs: a failing seed replays there
with `--replay SEED --renewal MODE`."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from shardlease.records import Renewal
from shardlease.sim import (
    Crash,
    Fault,
    HostFault,
    Join,
    Leave,
    Pause,
    ScenarioResult,
    StoreFault,
    case_for,
    run_scenario,
)
from shardlease.sim.swarm import KINDS
from tests.sim.regressions import PENDING_KINDS

TTL = 15.0
#: The fault kinds the swarm test draws from: all but those of open bugs
#: (tests/sim/regressions.py: their cases are pending there).
SWARM_POOL = [k for k in KINDS if k not in PENDING_KINDS]
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    print_blob=True)


@dataclass(frozen=True)
class Case:
    nodes: int
    shards: int
    seed: int
    max_concurrency: int
    faults: tuple[Fault, ...]
    renewal: Renewal = "shard"

    def run(self) -> ScenarioResult:
        return run_scenario(nodes=self.nodes, shards=self.shards, seed=self.seed,
                            max_concurrency=self.max_concurrency, faults=self.faults,
                            renewal=self.renewal)


times = st.integers(100, 1200).map(lambda t: t / 10)  # 10 .. 120 s
windows = st.integers(50, 600).map(lambda t: t / 10)  # 5 .. 60 s


def faults(names: list[str]) -> st.SearchStrategy[Fault]:
    node = st.sampled_from(names)
    return st.one_of(
        st.builds(Crash, at=times, node=node),
        st.builds(Pause, at=times, node=node,
                  duration=st.sampled_from([2.0, 10.0, 1.5 * TTL, 3 * TTL])),
        st.builds(lambda at, d, n, lat, jit, err, lost: StoreFault(
            at, at + d, node=n, latency=lat, jitter=jit, error_rate=err, lost_reply_rate=lost),
            times, windows, st.none() | node, st.sampled_from([0.0, 0.2, 1.0]),
            st.sampled_from([0.0, 0.5, 1.5]), st.sampled_from([0.0, 0.1, 0.5]),
            st.sampled_from([0.0, 0.1, 0.3])),
        st.builds(lambda at, d, n, ol, cl, oe, ce: HostFault(
            at, at + d, node=n, open_latency=ol, close_latency=cl, open_error_rate=oe,
            close_error_rate=ce),
            times, windows, st.none() | node, st.sampled_from([0.0, 1.0, 8.0, 20.0]),
            st.sampled_from([0.0, 1.0, 5.0]), st.sampled_from([0.0, 0.2, 0.6]),
            st.sampled_from([0.0, 0.2, 0.6])),
        # A new node, or a crashed or departed one coming back under its name.
        st.builds(Join, at=times, node=st.sampled_from([*names, "j0", "j1"]),
                  wall_skew=st.sampled_from([0.0, -300.0, 3600.0])),
        st.builds(Leave, at=times, node=node),
        # One node's listings frozen for up to 4 TTLs (a lagging cache or watch).
        st.builds(lambda at, d, n: StoreFault(at, at + d, node=n, stale=True),
                  times, st.sampled_from([5.0, 1.5 * TTL, 4 * TTL]), node),
    )


@st.composite
def cases(draw: st.DrawFn, max_faults: int = 4, kinds: tuple[type, ...] | None = None) -> Case:
    nodes = draw(st.integers(1, 6))
    names = [f"n{k}" for k in range(nodes)]
    fault = faults(names)
    if kinds is not None:
        fault = fault.filter(lambda f: isinstance(f, kinds))
    return Case(
        nodes=nodes,
        shards=draw(st.integers(1, 64)),
        seed=draw(st.integers(0, 2**32 - 1)),
        max_concurrency=draw(st.sampled_from([1, 4, 16])),
        faults=tuple(draw(st.lists(fault, max_size=max_faults))),
        renewal=draw(st.sampled_from(["shard", "node"])),
    )


def check(case: Case) -> ScenarioResult:
    note(repr(case))
    result = case.run()
    assert result.violations == [], "\n".join(result.violations)
    return result


@settings(SETTINGS, max_examples=150)
@given(cases())
def test_every_invariant_holds_under_any_fault_schedule(case: Case) -> None:
    check(case)


@settings(SETTINGS, max_examples=150)
@given(seed=st.integers(0, 2**32 - 1), renewal=st.sampled_from(["shard", "node"]))
def test_every_invariant_holds_in_swarm_cases(seed: int, renewal: Renewal) -> None:
    # Each case: a random subset of the fault kinds (swarm.KINDS: crash, pause,
    # store faults of every call, of one call kind, lost answers only, stale
    # listings, host faults, join, leave, TTL / interval / margin changed in
    # place, corrupt records; but the kinds of open bugs, PENDING_KINDS),
    # base TTL 6 to 120 s, up to six faults.
    case = case_for(seed, renewal, pool=SWARM_POOL)
    note(f"{case.reproducer()}\n{case.describe()}")
    result = case.run()
    assert result.violations == [], "\n".join(result.violations)


@settings(SETTINGS, max_examples=80)
@given(cases(max_faults=3, kinds=(Crash, Join, Leave)))
def test_membership_changes_recover_and_rebalance(case: Case) -> None:
    result = check(case)
    if result.quiescence is None or not result.quiescence.live:
        return  # nobody left to balance onto
    # After the last change, balanced for good within a TTL and 4 rounds: a
    # crash's leases expire (ttl + 2 intervals), a join or leave takes rounds.
    last = result.balance[-1]
    assert last.seconds is not None and last.seconds <= TTL + 4 * 5.0, last


@settings(SETTINGS, max_examples=60)
@given(cases(max_faults=0))
def test_without_faults_the_start_balances_within_three_rounds(case: Case) -> None:
    result = check(case)
    (start,) = result.balance
    assert start.rounds is not None and start.rounds <= 3, start
    assert result.counts.get("self_fence", 0) == 0
    assert result.counts.get("lost", 0) == 0


@settings(SETTINGS, max_examples=15)
@given(cases(max_faults=3))
def test_the_same_case_gives_the_same_trace(case: Case) -> None:
    note(repr(case))
    assert case.run().trace == case.run().trace
