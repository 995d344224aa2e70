"""Stop, then free, on every path (issue 38, item 1): a node stopped short
(its loop cancelled, as a second SIGTERM does; its runner dead; a task of its
loop failed) frees the leases of the shards its host closed, and leaves to
expire those its host may still have open. The real loop and runner, a memory
store, strict fake hosts, in virtual time."""

from __future__ import annotations

import asyncio

import pytest

from shardlease.errors import EngineError, RunnerDied
from shardlease.runner import FENCED_CLOSE_ATTEMPTS
from shardlease.stores.memory import MemoryBackend
from shardlease.telemetry import LeftToExpire, Release
from tests.test_loop import Node, idle, lease, now, virtual

#: How each abort is brought about, and what the loop's task then raises.
ABORTS = {
    "cancel": (None, asyncio.CancelledError),
    "runner": ("shardlease-runner", RunnerDied),
    "task": ("shardlease-renewals", EngineError),
}


def tasks_by_name() -> dict[str, asyncio.Task[object]]:
    """The running tasks of the one node started so far, by name."""
    return {t.get_name(): t for t in asyncio.all_tasks() if not t.done()}


async def balanced(a: Node, b: Node) -> None:
    for _ in range(20):
        await asyncio.sleep(5)
        if len(a.opened()) == 2 and len(b.opened()) == 2:
            return
    raise AssertionError(f"not balanced: {a.opened()} {b.opened()}")


@pytest.mark.parametrize("mode", ["shard", "node"])
@pytest.mark.parametrize("how", sorted(ABORTS))
@virtual
async def test_an_aborted_node_frees_only_what_its_host_closed(mode: str, how: str) -> None:
    backend = MemoryBackend()
    peers = lambda: ["a", "b"]  # noqa: E731
    a = Node("a", backend, peers=peers, renewal=mode).start()
    await idle()
    of_a = tasks_by_name()
    b = Node("b", backend, peers=peers, renewal=mode).start()
    await balanced(a, b)
    stuck, fine = sorted(a.opened())
    a.host.close_failures[stuck] = 10_000  # the application refuses to close it
    deadline = a.loop.runner.deadline(stuck)
    assert deadline is not None
    task_name, raised = ABORTS[how]
    assert a.task is not None
    (a.task if task_name is None else of_a[task_name]).cancel()
    with pytest.raises(raised):
        await a.task
    # The refused close leaves the shard open at a's host; its lease still
    # names a, and is said to be left to expire. The closed one is not.
    assert a.opened() == {stuck}
    assert (rec := lease(backend, stuck)) is not None and rec.owner == "a"
    assert [ev.shard for _, ev in a.of(LeftToExpire)] == [stuck]
    assert stuck not in {ev.shard for _, ev in a.of(Release)}
    # The peer opens it only once a's lease of it has expired: after the
    # deadline a's application was given, and it takes the closed one too.
    for _ in range(30):
        await asyncio.sleep(1)
        if stuck in b.opened() and fine in b.opened():
            break
    assert {stuck, fine} <= b.opened()
    assert b.host.times("open", stuck)[-1] > deadline
    assert b.host.times("open", fine)[-1] < b.host.times("open", stuck)[-1]
    b.task.cancel() if b.task else None
    await asyncio.gather(*(t for t in [b.task] if t), return_exceptions=True)


@pytest.mark.parametrize("mode", ["shard", "node"])
@virtual
async def test_a_second_signal_ends_the_node_within_an_interval_whatever_its_closes_do(
        mode: str) -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=2, renewal=mode).start()
    await asyncio.sleep(11)
    assert a.opened() == {0, 1}
    a.host.close_delay[0] = 1000.0  # the application hangs in this close
    stopping = asyncio.create_task(a.loop.stop())  # the first signal
    await asyncio.sleep(1)
    assert a.task is not None
    cancelled = now()
    a.task.cancel()  # the second
    with pytest.raises(asyncio.CancelledError):
        await a.task
    await stopping
    assert now() - cancelled <= a.loop.options.interval_s
    assert (rec := lease(backend, 0)) is not None and rec.owner == "a"
    assert [ev.shard for _, ev in a.of(LeftToExpire)] == [0]


@pytest.mark.parametrize("mode", ["shard", "node"])
@virtual
async def test_a_fenced_close_given_up_leaves_its_lease_to_expire(mode: str) -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=2, renewal=mode).start()  # ttl 15, margin 2.5
    await asyncio.sleep(11)
    assert a.opened() == {0, 1}
    deadline = a.loop.runner.deadline(0)
    assert deadline is not None
    a.host.close_failures[0] = 10_000
    a.loop.runner.fence([0])  # (as an epoch ended by a peer, or a deadline passed)
    fenced = now()
    await asyncio.sleep(0.5 + 1.0 + 0.1)  # the close tried FENCED_CLOSE_ATTEMPTS times
    assert len(a.host.times("close", 0)) == FENCED_CLOSE_ATTEMPTS
    (t, ev), = a.of(LeftToExpire)
    margin = a.loop.options.margin_s
    assert ev.shard == 0 and ev.left == pytest.approx(fenced + margin - t)
    # Not freed before the lease's expiry in a's eyes (the fence's deadline
    # + the margin); freed then, as an expired lease would be taken.
    await asyncio.sleep(fenced + margin - now() - 0.01)
    assert (rec := lease(backend, 0)) is not None and rec.owner == "a"
    await asyncio.sleep(0.1)
    await idle()
    released = [t for t, ev in a.of(Release) if ev.shard == 0]
    assert released and released[0] >= fenced + margin
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)


@pytest.mark.parametrize("mode", ["shard", "node"])
@virtual
async def test_a_second_signal_ends_the_node_within_an_interval_whatever_its_store_does(
        mode: str) -> None:
    # Every write of the way out hangs (the frees, the heartbeat's or the
    # epoch's end or deletion): what is not done within the interval is left
    # to a TTL of silence, as after a crash; the process does not wait.
    backend = MemoryBackend()
    a = Node("a", backend, shards=2, renewal=mode).start()
    await asyncio.sleep(11)
    assert a.opened() == {0, 1}
    for method in ("update_lease", "delete_heartbeat", "update_epoch", "delete_epoch"):
        a.store.delay[method] = 1000.0
    assert a.task is not None
    cancelled = now()
    a.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a.task
    assert now() - cancelled <= a.loop.options.interval_s
    assert a.opened() == set()  # closed, but not freed: left to a TTL of silence
    assert all((rec := lease(backend, s)) is not None and rec.owner == "a" for s in (0, 1))
