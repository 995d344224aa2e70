"""Unit tests of the runner, with a strict fake host, in virtual time."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from shardlease.clock import LoopClock
from shardlease.errors import EngineError, HostError, OutdatedGeneration, RunnerDied
from shardlease.runner import (
    CLOSE_RETRY_FIRST,
    FENCED_CLOSE_ATTEMPTS,
    Ended,
    Reason,
    Runner,
    State,
)
from shardlease.sim.fakes import StrictHost, recorder
from shardlease.sim.vloop import run_virtual
from shardlease.telemetry import (
    Closed,
    Event,
    Opened,
    Overrun,
    RenewSlow,
    SelfFence,
    Telemetry,
)


def virtual(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh virtual-time loop starting at t=0."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        run_virtual(fn(*args, **kwargs))

    return run


class Harness:
    def __init__(self, host: StrictHost | None = None, **kwargs: Any) -> None:
        self.host = host or StrictHost()
        self.telemetry = Telemetry()
        self.events = recorder(self.telemetry)
        self.closed: list[tuple[float, int, Reason]] = []
        #: shard -> the highest generation an OUTDATED close reported.
        self.highest: dict[int, int | None] = {}
        #: What the runner said of each shard it was done with, in order.
        self.ended: list[Ended] = []
        self.runner = Runner(self.host, cluster="c", node="n", clock=LoopClock(),
                             telemetry=self.telemetry, on_closed=self._on_closed, **kwargs)
        self.task: asyncio.Task[None] | None = None

    def _on_closed(self, ended: Ended) -> None:
        self.closed.append((asyncio.get_running_loop().time(), ended.shard, ended.reason))
        self.highest[ended.shard] = ended.highest
        self.ended.append(ended)

    def start(self) -> Harness:
        self.task = asyncio.create_task(self.runner.run())
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        assert self.host.problems == []

    def of(self, kind: type[Event]) -> list[tuple[float, Event]]:
        return [(t, ev) for t, ev in self.events if isinstance(ev, kind)]

    def reasons(self, shard: int) -> list[Reason]:
        return [r for _, s, r in self.closed if s == shard]


async def idle(n: int = 50) -> None:
    """Let every ready task run (no virtual time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


def now() -> float:
    return asyncio.get_running_loop().time()


@virtual
async def test_opens_at_most_max_concurrency_at_once() -> None:
    h = Harness(max_concurrency=3).start()
    for s in range(10):
        h.host.open_delay[s] = 1.0 + s / 10
        h.runner.start(s, generation=1, deadline=100.0)
    await idle()
    assert h.host.opening == 3
    await asyncio.sleep(20)
    assert h.host.max_opening == 3
    assert set(h.host.open_now) == set(range(10))
    assert all(h.runner.state(s) is State.OPEN for s in range(10))
    await h.stop()


@virtual
async def test_host_sees_open_then_close_in_order_per_shard() -> None:
    h = Harness().start()
    gate = asyncio.Event()
    h.host.open_gates[0] = gate
    h.runner.start(0, generation=7, deadline=100.0)
    await idle()
    h.runner.stop(0, Reason.RELEASE)  # while the open runs: it finishes, then the close
    await idle()
    assert h.host.ops(0) == ["open"]
    gate.set()
    await idle()
    assert h.host.ops(0) == ["open", "opened", "close", "closed"]
    assert [c.generation for c in h.host.calls if c.op == "open"] == [7]
    assert h.reasons(0) == [Reason.RELEASE]
    assert h.runner.state(0) is None
    await h.stop()


@virtual
async def test_a_shard_stopped_while_waiting_for_a_slot_is_never_opened() -> None:
    h = Harness(max_concurrency=1).start()
    gate = asyncio.Event()
    h.host.open_gates[0] = gate
    h.runner.start(0, 1, deadline=100.0)
    h.runner.start(1, 1, deadline=100.0)
    await idle()
    assert h.runner.state(1) is State.WAITING
    h.runner.stop(1, Reason.RELEASE)
    await idle()
    gate.set()
    await asyncio.sleep(1)
    assert h.host.ops(1) == []
    assert h.reasons(1) == [Reason.RELEASE]
    assert [ev.reason for _, ev in h.of(Closed) if ev.shard == 1] == ["release"]  # type: ignore[attr-defined]
    # The slot it never took is not lost: another shard can still open.
    h.runner.start(2, 1, deadline=100.0)
    await idle()
    assert 2 in h.host.open_now
    await h.stop()


@virtual
async def test_a_shard_past_its_deadline_is_closed_and_a_self_fence_reported() -> None:
    h = Harness().start()
    h.runner.start(0, 1, deadline=5.0)
    h.runner.start(1, 1, deadline=5.0)
    await idle()
    await asyncio.sleep(3)
    h.runner.extend(1, 20.0)  # a renewal: shard 1 lives on
    h.runner.extend(0, 4.0)  # never backwards
    assert h.runner.deadline(0) == 5.0
    await asyncio.sleep(10)
    assert h.host.times("close", 0) == [5.0]
    assert 1 in h.host.open_now
    fences = h.of(SelfFence)
    assert [(t, ev.shards) for t, ev in fences] == [(5.0, (0,))]  # type: ignore[attr-defined]
    assert h.reasons(0) == [Reason.FENCED]
    # A fenced shard's deadline is not moved any more by a late renewal.
    await h.stop()


@virtual
async def test_a_waiting_shard_past_its_deadline_is_not_opened_and_reported() -> None:
    h = Harness(max_concurrency=1).start()
    h.host.open_gates[0] = gate = asyncio.Event()
    h.runner.start(0, 1, deadline=100.0)
    h.runner.start(1, 1, deadline=5.0)
    await asyncio.sleep(10)
    gate.set()
    await asyncio.sleep(1)
    assert h.host.ops(1) == []
    assert h.reasons(1) == [Reason.FENCED]
    assert [ev.shards for _, ev in h.of(SelfFence)] == [(1,)]  # type: ignore[attr-defined]
    await h.stop()


@virtual
async def test_a_claim_already_past_its_deadline_is_not_opened_and_reported() -> None:
    # A claim whose store call took longer than ttl - margin hands the runner
    # a deadline in the past: not opened, and a self-fence is reported.
    h = Harness().start()
    await asyncio.sleep(10)
    h.runner.start(0, 1, deadline=9.0)
    await asyncio.sleep(1)
    assert h.host.ops(0) == []
    assert h.reasons(0) == [Reason.FENCED]
    assert [ev.shards for _, ev in h.of(SelfFence)] == [(0,)]  # type: ignore[attr-defined]
    await h.stop()


@virtual
async def test_a_fence_interrupts_an_open() -> None:
    h = Harness().start()
    h.host.open_gates[0] = asyncio.Event()  # never set: the open hangs
    h.runner.start(0, 1, deadline=5.0)
    await asyncio.sleep(10)
    assert h.host.ops(0) == ["open", "open_cancelled", "close", "closed"]
    assert h.host.times("close", 0) == [5.0]
    assert h.reasons(0) == [Reason.FENCED]
    await h.stop()


@virtual
async def test_a_fence_interrupts_an_open_already_stopped_for_a_release() -> None:
    # Released while opening (the open may finish), then the renewals stop:
    # at the deadline the fence must still interrupt the open.
    h = Harness().start()
    h.host.open_delay[0] = 30.0
    h.runner.start(0, 1, deadline=5.0)
    await idle()
    h.runner.stop(0, Reason.RELEASE)
    await asyncio.sleep(40)
    assert "opened" not in h.host.ops(0)
    assert h.host.times("close", 0) == [5.0]
    assert h.reasons(0) == [Reason.FENCED]
    assert [ev.shards for _, ev in h.of(SelfFence)] == [(0,)]  # type: ignore[attr-defined]
    await h.stop()


@virtual
async def test_a_failed_open_closes_the_shard_and_reports_open_failed() -> None:
    h = Harness().start()
    h.host.open_errors[0] = HostError("no disk")
    h.runner.start(0, 1, deadline=100.0)
    await asyncio.sleep(1)
    assert h.host.ops(0) == ["open", "open_failed", "close", "closed"]
    assert h.reasons(0) == [Reason.OPEN_FAILED]
    assert h.highest[0] is None
    assert h.of(Opened) == []
    await h.stop()


@virtual
async def test_an_open_refused_for_a_newer_generation_reports_it_with_the_close() -> None:
    h = Harness().start()
    h.host.open_errors[0] = OutdatedGeneration("seen 7", shard=0, generation=1, highest=7)
    h.runner.start(0, 1, deadline=100.0)
    await asyncio.sleep(1)
    assert h.host.ops(0) == ["open", "open_failed", "close", "closed"]
    assert h.reasons(0) == [Reason.OUTDATED]
    assert h.highest[0] == 7
    assert h.of(Opened) == []
    await h.stop()


@virtual
async def test_the_close_says_whether_the_host_accepted_the_open() -> None:
    # A blind claim (issue 38) learns only from this that its generation was
    # new to the host: opened and released (0), refused (1), failed (2),
    # released while waiting for a slot, never asked (3).
    h = Harness(max_concurrency=1).start()
    h.host.open_gates[0] = asyncio.Event()
    h.host.open_errors[1] = OutdatedGeneration("seen 7", shard=1, generation=1, highest=7)
    h.host.open_errors[2] = HostError("no disk")
    for shard in range(4):
        h.runner.start(shard, 1, deadline=100.0)
    await asyncio.sleep(1)
    h.runner.stop(3, Reason.RELEASE)
    h.host.open_gates[0].set()
    await asyncio.sleep(1)
    h.runner.stop(0, Reason.RELEASE)
    await asyncio.sleep(1)
    opened = {e.shard: e.opened for e in h.ended}
    assert opened == {0: True, 1: False, 2: False, 3: False}
    assert "open" not in h.host.ops(3)
    await h.stop()


@virtual
async def test_a_timed_out_open_closes_the_shard_and_reports_open_failed() -> None:
    h = Harness(open_timeout=3.0).start()
    h.host.open_gates[0] = asyncio.Event()
    h.runner.start(0, 1, deadline=100.0)
    await asyncio.sleep(10)
    assert h.host.ops(0) == ["open", "open_cancelled", "close", "closed"]
    assert h.host.times("close", 0) == [3.0]
    assert h.reasons(0) == [Reason.OPEN_FAILED]
    assert h.of(SelfFence) == []
    await h.stop()


@virtual
async def test_a_failed_close_is_retried_until_it_succeeds() -> None:
    h = Harness().start()
    h.runner.start(0, 1, deadline=1000.0)
    await idle()
    h.host.close_failures[0] = 4
    h.runner.stop(0, Reason.RELEASE)
    await asyncio.sleep(30)
    closes = h.host.times("close", 0)
    assert len(closes) == 5
    gaps = [b - a for a, b in itertools.pairwise(closes)]
    assert gaps == [CLOSE_RETRY_FIRST * 2**k for k in range(4)]
    # The loop hears of it (and frees the lease) only once the close succeeded.
    assert h.closed == [(closes[-1], 0, Reason.RELEASE)]
    assert h.host.open_now == {}
    await h.stop()


@virtual
async def test_a_fenced_close_that_keeps_failing_is_given_up() -> None:
    h = Harness().start()
    h.runner.start(0, 1, deadline=5.0)
    await idle()
    h.host.close_failures[0] = 100
    await asyncio.sleep(60)
    assert len(h.host.times("close", 0)) == FENCED_CLOSE_ATTEMPTS
    assert h.reasons(0) == [Reason.FENCED]
    await h.stop()


@virtual
async def test_a_release_close_failing_past_the_deadline_becomes_a_fence() -> None:
    h = Harness().start()
    h.runner.start(0, 1, deadline=10.0)
    await idle()
    h.host.close_failures[0] = 100
    h.runner.stop(0, Reason.RELEASE)
    await asyncio.sleep(120)
    assert h.reasons(0) == [Reason.FENCED]
    assert [(t, ev.shards) for t, ev in h.of(SelfFence)] == [(10.0, (0,))]  # type: ignore[attr-defined]
    await h.stop()


@virtual
async def test_cancelling_the_runner_closes_every_shard() -> None:
    h = Harness(max_concurrency=2).start()
    h.host.open_gates[1] = asyncio.Event()  # still opening when the runner goes
    h.host.open_gates[2] = asyncio.Event()
    for s in range(4):
        h.runner.start(s, 1, deadline=100.0)
    await idle()
    assert [h.runner.state(s) for s in range(4)] == [
        State.OPEN, State.OPENING, State.OPENING, State.WAITING]
    await h.stop()
    assert h.host.open_now == {}
    assert h.host.ops(0) == ["open", "opened", "close", "closed"]
    for s in (1, 2):
        assert h.host.ops(s) == ["open", "open_cancelled", "close", "closed"]
    assert h.host.ops(3) == []  # waiting: never opened, nothing to close
    # Every shard is reported, the waiting one too: its lease may be freed.
    assert sorted(s for _, s, _ in h.closed) == [0, 1, 2, 3]
    assert all(e.closed for e in h.ended)


@virtual
async def test_a_dead_worker_kills_the_runner_which_closes_every_shard() -> None:
    class Boom(BaseException):
        pass

    h = Harness().start()
    for s in range(3):
        h.runner.start(s, 1, deadline=100.0)
    await idle()
    h.host.close_raises[0] = Boom()
    h.runner.stop(0, Reason.RELEASE)
    await idle()
    assert h.task is not None and h.task.done()
    assert isinstance(h.task.exception(), RunnerDied)
    assert h.host.open_now == {0: 1} or h.host.open_now == {}
    assert 1 not in h.host.open_now and 2 not in h.host.open_now
    # What the host may still have open is said so: its lease is not freed.
    closed = {e.shard: e.closed for e in h.ended}
    assert closed == {0: 0 not in h.host.open_now, 1: True, 2: True}
    with pytest.raises(RunnerDied):
        h.runner.start(5, 1, 100.0)


@virtual
async def test_opened_event_carries_the_deadline() -> None:
    h = Harness().start()
    h.runner.start(3, 4, deadline=12.5)
    await idle()
    (_t, ev), = h.of(Opened)
    assert isinstance(ev, Opened)
    assert (ev.shard, ev.generation, ev.deadline) == (3, 4, 12.5)
    await h.stop()


@virtual
async def test_start_refuses_a_shard_already_in_the_runner() -> None:
    h = Harness().start()
    h.runner.start(0, 1, 100.0)
    with pytest.raises(EngineError, match="already in the runner") as refused:
        h.runner.start(0, 2, 100.0)
    assert not isinstance(refused.value, RunnerDied)
    await h.stop()


@virtual
async def test_cancelling_the_runner_as_it_is_woken_still_stops_it() -> None:
    # Python 3.11's wait_for loses a cancellation that arrives as the awaited
    # future completes: the runner must not wait on its wake-up through it.
    h = Harness().start()
    h.runner.start(0, 1, deadline=100.0)  # a pending deadline: a timed wait
    await idle()
    h.runner.extend(0, 200.0)  # wakes the supervisor...
    assert h.task is not None
    h.task.cancel()  # ...in the same instant as it is cancelled
    done, _ = await asyncio.wait({h.task}, timeout=10)
    assert done, "the runner ignored its cancellation"
    assert h.host.open_now == {}
    await h.stop()


@virtual
async def test_a_shard_not_renewed_is_reported_before_its_fence_once_per_deadline() -> None:
    h = Harness(warn_ahead=2.5).start()
    h.runner.start(0, 1, deadline=10.0)
    h.runner.start(1, 1, deadline=10.0)
    await idle()
    await asyncio.sleep(8)
    h.runner.extend(1, 20.0)  # renewed at 8, shard 0 is not
    await asyncio.sleep(13)
    slow = [(t, ev.shards, ev.left) for t, ev in h.of(RenewSlow)]  # type: ignore[attr-defined]
    assert slow == [(7.5, (0, 1), 2.5), (17.5, (1,), 2.5)]
    fences = [(t, ev.shards) for t, ev in h.of(SelfFence)]  # type: ignore[attr-defined]
    assert fences == [(10.0, (0,)), (20.0, (1,))]
    await h.stop()


@virtual
async def test_a_deadline_already_close_is_reported_before_the_fence_at_the_same_instant() -> None:
    h = Harness(warn_ahead=2.5).start()
    h.runner.start(0, 1, deadline=1.0)
    await idle()
    await asyncio.sleep(2)
    kinds = [type(ev).__name__ for _, ev in h.events
             if isinstance(ev, RenewSlow | SelfFence)]
    assert kinds == ["RenewSlow", "SelfFence"]
    await h.stop()


@virtual
async def test_a_fenced_close_is_abandoned_when_the_lease_can_be_taken() -> None:
    h = Harness(margin=2.5).start()
    h.runner.start(0, 7, deadline=10.0)
    await idle()
    h.host.close_delay[0] = 40.0  # the application hangs in close
    await asyncio.sleep(30)
    assert h.host.ops(0) == ["open", "opened", "close", "close_cancelled"]
    assert h.host.times("close_cancelled", 0) == [12.5]  # deadline + margin, not 50
    (t, overrun), = h.of(Overrun)
    assert t == 12.5 and overrun.shard == 0 and overrun.generation == 7  # type: ignore[attr-defined]
    assert overrun.late == 2.5  # type: ignore[attr-defined]
    assert h.reasons(0) == [Reason.FENCED]
    await h.stop()


@virtual
async def test_a_release_close_that_the_fence_overtakes_is_bounded_too() -> None:
    h = Harness(margin=2.5).start()
    h.runner.start(0, 1, deadline=10.0)
    await idle()
    h.host.close_delay[0] = 40.0
    h.runner.stop(0, Reason.RELEASE)  # the close starts at 0 with the lease renewed...
    await asyncio.sleep(5)
    h.runner.extend(0, 20.0)  # ...until renewals stop: fenced at 20
    await asyncio.sleep(30)
    assert h.host.times("close_cancelled", 0) == [22.5]
    assert [t for t, _ in h.of(SelfFence)] == [20.0] and len(h.of(Overrun)) == 1
    assert h.reasons(0) == [Reason.FENCED]
    await h.stop()


@virtual
async def test_cancelling_the_runner_closes_every_shard_at_once_within_its_expiry() -> None:
    h = Harness(margin=2.5).start()
    for s in range(3):
        h.runner.start(s, 1, deadline=10.0 + s)
    await idle()
    for s in range(3):
        h.host.close_delay[s] = 1.0
    h.host.close_delay[2] = 60.0  # this one hangs
    await asyncio.sleep(1)
    await h.stop()
    assert [h.host.times("close", s) for s in range(3)] == [[1.0], [1.0], [1.0]]  # concurrent
    assert [h.host.times("closed", s) for s in range(3)] == [[2.0], [2.0], []]
    assert h.host.times("close_cancelled", 2) == [12.0 + 2.5]  # its deadline + margin
    assert now() == 14.5
    assert [ev.shard for _, ev in h.of(Overrun)] == [2]  # type: ignore[attr-defined]


@virtual
async def test_a_shard_whose_close_was_abandoned_is_closed_before_it_opens_again() -> None:
    h = Harness(margin=2.5).start()
    h.runner.start(0, 1, deadline=10.0)
    await idle()
    h.host.close_delay[0] = 40.0
    await asyncio.sleep(15)  # fenced at 10, abandoned at 12.5
    assert len(h.of(Overrun)) == 1 and h.runner.state(0) is None
    h.host.close_delay.clear()
    h.runner.start(0, 2, deadline=50.0)  # claimed again later
    await idle()
    assert h.host.ops(0) == ["open", "opened", "close", "close_cancelled",
                             "close", "closed", "open", "opened"]
    assert h.host.open_now == {0: 2}
    await h.stop()
