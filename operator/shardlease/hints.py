"""Hints between peers: one UDP datagram that wakes a peer's next round.

When a node frees leases (a graceful stop, a release above its share) or
joins (its liveness record landed), its peers would otherwise see it only at
their next round, up to an interval later, and a freed shard stays unowned
that long. On Kubernetes the Lease watch tells every agent at once
(`stores.kubernetes`); S3 and the file store have no watch, so the node tells
the peers it knows of (the pod list, or `--peer NAME=HOST:PORT`) itself.

A hint is never trusted for safety: it only calls `PlacementLoop.hint()`,
which starts a round early; the round judges what it reads as any round does
and every claim stays a compare-and-swap. So a hint needs no secret (a forged
one costs the receiver at most a round every `loop.HINT_GAP` intervals, after a
burst of `loop.HINT_BURST`), may
be lost (the round comes at its time anyway), and is a datagram rather than
a request: nothing waits for an answer, nothing retries.

The frees of one burst (an epoch's end frees every lease at once; shard-mode
frees come one write each) are sent as one datagram per peer: a hint waits
`COALESCE` seconds for the rest of its burst. A hint that says all there is
(`complete`: a join, or an epoch's end) starts the receiver's round at once;
a free may be one of several, so its round waits `loop.HINT_SETTLE` for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardlease.errors import ConfigError
from shardlease.telemetry import Event, Joined, Release

logger = logging.getLogger("shardlease.hints")

#: Seconds a hint waits for the rest of its burst before it is sent.
COALESCE = 0.005
#: A hint datagram is a few dozen bytes; anything larger is not one.
MAX_DATAGRAM = 1024
#: At most one warning about malformed datagrams per this many seconds.
WARN_EVERY = 60.0

Why = Literal["freed", "joined"]
#: What a burst is about: `Why`, or an epoch's end (sent as "freed", complete).
Reason = Literal["freed", "joined", "ended"]


class Hint(BaseModel):
    """What a hint datagram holds (JSON): who sends it and why."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    cluster: str = Field(min_length=1, max_length=63)
    node: str = Field(min_length=1, max_length=253)
    why: Why
    #: Nothing more follows (an epoch's end freed every lease of it, or a
    #: join): the receiver's round need not wait for more. Absent in the
    #: hints of older versions (a free then settles), and ignored by older
    #: receivers (extra="ignore"), which read an epoch's end as a free.
    complete: bool = False
    format: int = Field(default=1, ge=1)


def parse_address(spec: str, what: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[V6]:PORT`) -> (host, port); ConfigError otherwise."""
    host, sep, port = spec.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {spec!r} must look like HOST:PORT")
    return host, int(port)


class HintChannel(asyncio.DatagramProtocol):
    """Sends this node's hints to its peers and wakes its loop on theirs.

    `peers()` gives each peer's hint address (name -> "HOST:PORT"), asked
    afresh at every send (the pod list changes); `on_hint` is the loop's
    `hint`. Subscribe `on_event` to the loop's telemetry: a `Release` sends
    "freed", a `Joined` sends "joined"."""

    def __init__(self, *, cluster: str, name: str, listen: tuple[str, int],
                 peers: Callable[[], Mapping[str, str]],
                 on_hint: Callable[[bool], None]) -> None:
        self.cluster = cluster
        self.name = name
        self.listen = listen
        self.peers = peers
        self.on_hint = on_hint
        self.transport: asyncio.DatagramTransport | None = None
        self._pending: set[Reason] = set()
        self._sending: asyncio.Task[None] | None = None
        self._warned_at = -WARN_EVERY
        #: Counts, for tests and metrics: datagrams sent, hints taken, dropped.
        self.sent = 0
        self.received = 0
        self.ignored = 0

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Bind the listening socket; returns the address bound (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: self, local_addr=self.listen)
        except OSError as e:
            raise ConfigError(f"cannot listen for hints on {self.listen[0]}:{self.listen[1]}: "
                              f"{e.strerror or e}") from None
        self.transport = transport
        bound = transport.get_extra_info("sockname")
        return str(bound[0]), int(bound[1])

    async def aclose(self, flush: float = 1.0) -> None:
        """Close the socket once the hints of a burst begun are out (a stop's
        last frees are the hints that matter most), waiting `flush` at most."""
        if self._sending is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(flush):
                    await self._sending
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # -- sending ---------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if isinstance(event, Release):
            self.send("ended" if event.ended else "freed")
        elif isinstance(event, Joined):
            self.send("joined")

    def send(self, why: Reason) -> None:
        """Hint every peer, once per burst."""
        self._pending.add(why)
        if self.transport is None or (self._sending is not None and not self._sending.done()):
            return
        self._sending = asyncio.get_running_loop().create_task(self._send_burst())

    async def _send_burst(self) -> None:
        # A hint asked for while a burst is being sent (it may wait on a
        # peer's name to resolve) gets a burst of its own after it: the one
        # being sent took its reasons before that free happened.
        while self._pending:
            await asyncio.sleep(COALESCE)
            await self._send_one_burst()

    async def _send_one_burst(self) -> None:
        pending, self._pending = self._pending, set()
        # "joined" matters more than "freed" to nobody: the receiver does the
        # same either way; the reason is for its logs.
        why: Why = "joined" if "joined" in pending else "freed"
        # Complete only when nothing in the burst is a lone free: a burst
        # with a shard-mode free in it may have more frees coming.
        complete = "freed" not in pending
        data = Hint(cluster=self.cluster, node=self.name, why=why,
                    complete=complete).model_dump_json().encode()
        for peer, address in sorted(self.peers().items()):
            if peer == self.name or self.transport is None:
                continue
            try:
                host, port = parse_address(address, f"the hint address of {peer}")
                target = await self._resolve(host, port)
                if self.transport is None:  # closed while the name resolved
                    return
                self.transport.sendto(data, target)
                self.sent += 1
            except (ConfigError, OSError) as e:
                # A peer not reachable now is told nothing: its round comes anyway.
                logger.debug("no hint to %s: %s", peer, e)

    async def _resolve(self, host: str, port: int) -> tuple[str, int]:
        assert self.transport is not None
        family = self.transport.get_extra_info("socket").family
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, family=family, type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(f"{host} has no address")
        address = infos[0][4]
        return str(address[0]), int(address[1])

    # -- receiving -------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        try:
            if len(data) > MAX_DATAGRAM:
                raise ValueError(f"{len(data)} bytes")
            hint = Hint.model_validate_json(data)
        except (ValidationError, ValueError) as e:
            self.ignored += 1
            self._warn(f"ignored a datagram from {addr[0]} that is no hint: "
                       f"{str(e).splitlines()[0]}")
            return
        if hint.cluster != self.cluster or hint.node == self.name:
            self.ignored += 1
            logger.debug("ignored a hint of cluster %s from %s", hint.cluster, hint.node)
            return
        self.received += 1
        logger.debug("hint from %s: %s", hint.node, hint.why)
        # (A freed lease may be one of several frees: the round waits a
        # little for the others; a join or an epoch's end says all there is.)
        self.on_hint(hint.why == "freed" and not hint.complete)

    def error_received(self, exc: Exception) -> None:
        # (An ICMP unreachable from a peer that is not listening yet.)
        logger.debug("hint socket: %s", exc)

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY:
            self._warned_at = now
            logger.warning("%s", message)
