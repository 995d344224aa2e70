"""The runner and a host that learns validities (`LeasedHost`): the open
carries the shard's validity, the renewals of a pass reach the host as one
`extend` call (never more than one in flight, never in the way of a renewal
or a fence), and an abandoned fenced close is followed by an `abort`.
Virtual time, with a strict fake host."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from shardlease.errors import HostError
from shardlease.hosts.base import LeasedHost, Validity
from shardlease.runner import Reason, State
from shardlease.sim.fakes import StrictHost
from shardlease.telemetry import ExtendFailed, SelfFence

from .test_runner import Harness, idle, now, virtual


@dataclass(frozen=True)
class Extend:
    t: float
    leases: dict[int, Validity]


class LeasedStrictHost(StrictHost):
    """StrictHost, plus the validity calls, recorded with the loop's time."""

    def __init__(self) -> None:
        super().__init__()
        #: (time, shard, generation, validity) of every open_for.
        self.opened_for: list[tuple[float, int, int, float]] = []
        self.extends: list[Extend] = []
        self.extending = 0
        self.max_extending = 0
        #: extend() waits for this event when set; raises this when set.
        self.extend_gate: asyncio.Event | None = None
        self.extend_error: BaseException | None = None
        self.aborts: list[tuple[float, int, int]] = []
        self.abort_gate: asyncio.Event | None = None

    async def open_for(self, shard: int, generation: int, validity: float) -> None:
        self.opened_for.append((now(), shard, generation, validity))
        await self.open(shard, generation)

    async def extend(self, leases: Mapping[int, Validity]) -> None:
        self.extends.append(Extend(now(), dict(leases)))
        self.extending += 1
        self.max_extending = max(self.max_extending, self.extending)
        try:
            if self.extend_gate is not None:
                await self.extend_gate.wait()
            if self.extend_error is not None:
                raise self.extend_error
        finally:
            self.extending -= 1

    async def abort(self, shard: int, generation: int) -> None:
        self.aborts.append((now(), shard, generation))
        if self.abort_gate is not None:
            await self.abort_gate.wait()


def leased(**kwargs: object) -> tuple[Harness, LeasedStrictHost]:
    host = LeasedStrictHost()
    assert isinstance(host, LeasedHost) and not isinstance(StrictHost(), LeasedHost)
    h = Harness(host, **kwargs)  # type: ignore[arg-type]
    return h.start(), host


@virtual
async def test_the_open_carries_the_validity_left_when_it_is_sent() -> None:
    h, host = leased(max_concurrency=1)
    host.open_gates[0] = gate = asyncio.Event()
    h.runner.start(0, 3, deadline=10.0)
    h.runner.start(1, 4, deadline=12.0)  # waits for the slot
    await asyncio.sleep(2)
    gate.set()
    await idle()
    assert host.opened_for == [(0.0, 0, 3, 10.0), (2.0, 1, 4, 10.0)]
    assert host.ops(1) == ["open", "opened"]
    await h.stop()


@virtual
async def test_a_pass_of_renewals_reaches_the_host_as_one_extend_at_its_end() -> None:
    h, host = leased()
    for s in range(4):
        h.runner.start(s, 10 + s, deadline=10.0)
    await asyncio.sleep(1)
    # A pass: three renewals land one after the other, shard 3's fails.
    for s in range(3):
        h.runner.extend(s, 14.0 + s)
        await asyncio.sleep(0.5)
    assert host.extends == []  # nothing before the pass ends
    h.runner.flush()
    await idle()
    assert host.extends == [Extend(2.5, {0: Validity(10, 11.5), 1: Validity(11, 12.5),
                                         2: Validity(12, 13.5)})]
    h.runner.flush()  # nothing moved since: nothing sent
    await idle()
    assert len(host.extends) == 1
    await asyncio.sleep(20)  # shard 3 is fenced at 10; the others at their deadlines
    assert [(t, ev.shards) for t, ev in h.of(SelfFence)] == [  # type: ignore[attr-defined]
        (10.0, (3,)), (14.0, (0,)), (15.0, (1,)), (16.0, (2,))]
    assert all(s not in host.open_now for s in range(4))
    assert host.max_extending == 1
    await h.stop()


@virtual
async def test_a_shard_still_waiting_to_open_learns_its_validity_from_the_open() -> None:
    h, host = leased(max_concurrency=1)
    host.open_gates[0] = gate = asyncio.Event()
    h.runner.start(0, 1, deadline=10.0)
    h.runner.start(1, 1, deadline=10.0)
    await asyncio.sleep(1)
    h.runner.extend(0, 15.0)  # opening: told by extend
    h.runner.extend(1, 15.0)  # waiting: told by its open
    h.runner.flush()
    await idle()
    assert host.extends == [Extend(1.0, {0: Validity(1, 14.0)})]
    await asyncio.sleep(1)
    gate.set()
    await idle()
    assert host.opened_for[-1] == (2.0, 1, 1, 13.0)
    await h.stop()


@virtual
async def test_at_most_one_extend_is_in_flight_and_a_flush_meanwhile_goes_next() -> None:
    h, host = leased(extend_timeout=100.0)
    for s in range(3):
        h.runner.start(s, 1, deadline=50.0)
    await idle()
    host.extend_gate = gate = asyncio.Event()
    h.runner.extend(0, 55.0)
    h.runner.flush()
    await asyncio.sleep(1)
    for deadline in (56.0, 57.0):  # two more passes while the first call hangs
        h.runner.extend(1, deadline)
        h.runner.extend(2, deadline)
        h.runner.flush()
        await asyncio.sleep(1)
    assert len(host.extends) == 1 and host.extending == 1
    # The renewals themselves are not held up: the deadlines moved.
    assert [h.runner.deadline(s) for s in range(3)] == [55.0, 57.0, 57.0]
    gate.set()
    await idle()
    assert host.max_extending == 1
    assert [e.t for e in host.extends] == [0.0, 3.0]
    assert host.extends[1].leases == {1: Validity(1, 54.0), 2: Validity(1, 54.0)}
    await h.stop()


@virtual
async def test_a_failed_extend_is_reported_and_retried_with_the_next_pass() -> None:
    h, host = leased(extend_timeout=5.0)
    h.runner.start(0, 2, deadline=20.0)
    await idle()
    host.extend_error = HostError("the application answered 503")
    h.runner.extend(0, 25.0)
    h.runner.flush()
    await idle()
    (t, failed), = h.of(ExtendFailed)
    assert t == 0.0 and failed.shards == (0,) and "503" in failed.error  # type: ignore[attr-defined]
    assert h.runner.running and h.runner.state(0) is State.OPEN
    host.extend_error = None
    await asyncio.sleep(5)
    h.runner.flush()  # the next pass moved nothing, yet shard 0 is still owed
    await idle()
    assert host.extends[-1] == Extend(5.0, {0: Validity(2, 20.0)})
    await h.stop()


@virtual
async def test_a_hanging_extend_is_abandoned_at_its_bound_and_the_fence_comes_on_time() -> None:
    h, host = leased(extend_timeout=3.0)
    h.runner.start(0, 1, deadline=10.0)
    await idle()
    host.extend_gate = asyncio.Event()  # never set
    h.runner.extend(0, 12.0)
    h.runner.flush()
    await asyncio.sleep(20)
    # Abandoned at 3; sent again at 10, when the validity told with the open
    # ran out (warn_ahead is 0 here), abandoned at 13. Neither held up the fence.
    assert [e.t for e in host.extends] == [0.0, 10.0]
    assert [t for t, _ in h.of(ExtendFailed)] == [3.0, 13.0]
    assert [t for t, _ in h.of(SelfFence)] == [12.0]
    assert host.times("close", 0) == [12.0]
    assert h.reasons(0) == [Reason.FENCED]
    await h.stop()


@virtual
async def test_the_runner_flushes_itself_when_a_slow_pass_would_let_a_told_validity_run_out(
        ) -> None:
    # The pass never ends (a renewal of another shard hangs in the store):
    # shard 0 renewed early in it must still be told before its told validity
    # runs out, or the application would stop acting on a shard still held.
    h, host = leased(warn_ahead=2.0)
    h.runner.start(0, 1, deadline=10.0)
    await idle()
    h.runner.extend(0, 15.0)  # at 0: told until 10, now until 15
    await asyncio.sleep(20)
    assert host.extends[0] == Extend(8.0, {0: Validity(1, 7.0)})  # at 10 - warn_ahead
    assert h.of(ExtendFailed) == []
    await h.stop()


@virtual
async def test_an_abandoned_fenced_close_is_followed_by_an_abort_that_never_blocks() -> None:
    h, host = leased(margin=2.5)
    h.runner.start(0, 7, deadline=10.0)
    await idle()
    host.close_delay[0] = 40.0  # the application hangs in close...
    host.abort_gate = asyncio.Event()  # ...and in abort
    await asyncio.sleep(15)
    assert host.aborts == [(12.5, 0, 7)]  # at the lease's expiry
    assert h.runner.state(0) is None and h.reasons(0) == [Reason.FENCED]
    host.close_delay.clear()
    h.runner.start(0, 8, deadline=50.0)  # claimed again: not held up by the abort
    await idle()
    assert host.ops(0)[-4:] == ["close", "closed", "open", "opened"]
    assert host.opened_for[-1] == (15.0, 0, 8, 35.0)
    await h.stop()  # the abort still hanging is bounded (close_timeout)


@virtual
async def test_a_fenced_close_given_up_after_its_attempts_is_aborted_too() -> None:
    h, host = leased(margin=100.0)
    h.runner.start(0, 3, deadline=10.0)
    await idle()
    host.close_failures[0] = 99
    await asyncio.sleep(30)
    assert [(s, g) for _, s, g in host.aborts] == [(0, 3)]
    assert h.reasons(0) == [Reason.FENCED]
    await h.stop()


@virtual
async def test_a_host_without_validities_is_opened_and_driven_as_before() -> None:
    h = Harness().start()
    assert h.runner.leased is None
    h.runner.start(0, 1, deadline=10.0)
    await idle()
    h.runner.extend(0, 20.0)
    h.runner.flush()
    await asyncio.sleep(5)
    assert h.host.ops(0) == ["open", "opened"]
    await h.stop()
