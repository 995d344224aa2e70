"""The hint channel (shardlease.hints) over real UDP sockets on loopback:
what it sends, when, and what it ignores. The loop's side of a hint (a woken
round, rate-limited) is in tests/test_loop.py."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from shardlease.errors import ConfigError
from shardlease.hints import Hint, HintChannel, parse_address
from shardlease.telemetry import Joined, Release, Round


class Peer:
    def __init__(self, name: str, peers: dict[str, str], cluster: str = "c") -> None:
        self.woken = 0
        #: Each hint's `settle`: True for a freed lease, False for a join.
        self.settles: list[bool] = []
        self.channel = HintChannel(cluster=cluster, name=name, listen=("127.0.0.1", 0),
                                   peers=lambda: peers, on_hint=self.wake)

    def wake(self, settle: bool) -> None:
        self.woken += 1
        self.settles.append(settle)

    async def start(self) -> str:
        host, port = await self.channel.start()
        return f"{host}:{port}"


async def until(check: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # type: ignore[operator]  # noqa: ASYNC110 - polls counters
            await asyncio.sleep(0.005)


async def test_a_burst_of_frees_sends_one_hint_per_peer_which_wakes_it() -> None:
    peers: dict[str, str] = {}
    a, b, c = Peer("a", peers), Peer("b", peers), Peer("c", peers)
    for name, p in (("a", a), ("b", b), ("c", c)):
        peers[name] = await p.start()
    try:
        for shard in range(50):
            a.channel.on_event(Release(cluster="c", node="a", shard=shard))
        a.channel.on_event(Round(cluster="c", node="a", live_nodes=3, share=1, held=0,
                                 duration=0.0, ok=True))  # not a reason to hint
        await until(lambda: b.woken and c.woken)
        await asyncio.sleep(0.1)
        assert (a.channel.sent, b.woken, c.woken, a.woken) == (2, 1, 1, 0)
        c.channel.on_event(Joined(cluster="c", node="c"))
        await until(lambda: a.woken and b.woken == 2)
        assert c.channel.sent == 2
        # A free's round waits for more frees; a join's starts at once.
        assert b.settles == [True, False] and a.settles == [False]
    finally:
        for p in (a, b, c):
            await p.channel.aclose()


async def test_a_free_during_a_burst_still_being_sent_gets_a_burst_of_its_own() -> None:
    # A burst waits on each peer's address in turn (a name to resolve); a
    # free in the meantime must not be folded into the burst already taken.
    peers: dict[str, str] = {}
    a, b = Peer("a", peers), Peer("b", peers)
    peers["a"], peers["b"] = await a.start(), await b.start()
    peers["slow"] = "slow.example:1"
    resolving, answer = asyncio.Event(), asyncio.Event()
    resolve = a.channel._resolve

    async def slow_resolve(host: str, port: int) -> tuple[str, int]:
        if host == "slow.example":
            resolving.set()
            await answer.wait()
            raise OSError("no such host")
        return await resolve(host, port)

    a.channel._resolve = slow_resolve  # type: ignore[method-assign]
    try:
        a.channel.send("freed")
        await until(lambda: b.woken == 1 and resolving.is_set())
        a.channel.send("freed")  # while the first burst waits on "slow"
        resolving.clear()
        answer.set()
        await until(lambda: b.woken == 2)
    finally:
        await a.channel.aclose()
        await b.channel.aclose()


async def test_a_stop_flushes_the_hints_of_its_last_frees() -> None:
    peers: dict[str, str] = {}
    a, b = Peer("a", peers), Peer("b", peers)
    peers["a"], peers["b"] = await a.start(), await b.start()
    a.channel.on_event(Release(cluster="c", node="a", shard=0))
    await a.channel.aclose()  # at once, before the burst's wait is over
    await until(lambda: b.woken == 1)
    await b.channel.aclose()


async def test_datagrams_that_are_no_hint_of_this_cluster_wake_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    peers: dict[str, str] = {}
    a = Peer("a", peers)
    peers["a"] = address = await a.start()
    host, port = parse_address(address, "test")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, \
                caplog.at_level(logging.DEBUG, logger="shardlease.hints"):
            for data in (b"garbage", b"{}", b'{"cluster": "c", "node": "b", "why": "bored"}',
                         b"x" * 4096,
                         Hint(cluster="other", node="b", why="freed").model_dump_json().encode(),
                         Hint(cluster="c", node="a", why="freed").model_dump_json().encode()):
                sock.sendto(data, (host, port))
            await until(lambda: a.channel.ignored == 6)
            sock.sendto(Hint(cluster="c", node="b", why="freed").model_dump_json().encode(),
                        (host, port))
            await until(lambda: a.woken == 1)
        # One warning for the lot (rate-limited), naming what was wrong.
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "no hint" in warnings[0], warnings
    finally:
        await a.channel.aclose()


async def test_a_peer_whose_address_is_wrong_or_unreachable_is_skipped() -> None:
    peers: dict[str, str] = {"bad": "no-port", "gone": "127.0.0.1:9", "nowhere": "host.invalid:1"}
    a, b = Peer("a", peers), Peer("b", peers)
    peers["a"], peers["b"] = await a.start(), await b.start()
    try:
        a.channel.send("freed")
        await until(lambda: b.woken == 1)
        a.channel.send("freed")  # the socket still works after an ICMP unreachable
        await until(lambda: b.woken == 2)
    finally:
        await a.channel.aclose()
        await b.channel.aclose()


@pytest.mark.parametrize("spec", ["", "host", ":1", "host:", "host:x", "host:70000"])
def test_a_malformed_address_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="must look like HOST:PORT"):
        parse_address(spec, "--hints")


def test_addresses_parse() -> None:
    assert parse_address("127.0.0.1:8471", "x") == ("127.0.0.1", 8471)
    assert parse_address("[::1]:8471", "x") == ("::1", 8471)
    assert parse_address("pod.svc:0", "x") == ("pod.svc", 0)


async def test_a_port_in_use_is_a_config_error() -> None:
    peers: dict[str, str] = {}
    a = Peer("a", peers)
    address = await a.start()
    host, port = parse_address(address, "x")
    b = HintChannel(cluster="c", name="b", listen=(host, port), peers=dict, on_hint=lambda _: None)
    try:
        with pytest.raises(ConfigError, match="cannot listen for hints"):
            await b.start()
    finally:
        await a.channel.aclose()


async def test_an_epochs_end_wakes_a_round_at_once_and_old_hints_still_settle() -> None:
    # docs/renewal.md rule 12: an ended epoch says it all (one write freed
    # every lease of it), so its round starts at once, as on Kubernetes (the
    # watch's change of an epoch does not settle). Before, the datagram said
    # only "freed" and every receiver waited HINT_SETTLE for frees that
    # never come: 0.1 s more on every move of a node-mode stop.
    peers: dict[str, str] = {}
    a, b = Peer("a", peers), Peer("b", peers)
    peers["a"], peers["b"] = await a.start(), await b.start()
    host, port = parse_address(peers["b"], "test")
    try:
        for shard in range(4):  # as Keeper.end_epoch emits them
            a.channel.on_event(Release(cluster="c", node="a", shard=shard, ended=True))
        await until(lambda: b.woken == 1)
        a.channel.on_event(Release(cluster="c", node="a", shard=9))  # one free, shard mode
        await until(lambda: b.woken == 2)
        assert b.settles == [False, True]
        # A hint of an older version (no `complete`) is a free, which settles;
        # an older receiver ignores the field it does not know (extra="ignore").
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b'{"cluster": "c", "node": "x", "why": "freed", "format": 1}',
                        (host, port))
            await until(lambda: b.woken == 3)
        assert b.settles[-1] is True
        sent = Hint(cluster="c", node="a", why="freed", complete=True).model_dump()
        assert sent["why"] == "freed"  # what an older receiver knows
    finally:
        await a.channel.aclose()
        await b.channel.aclose()
