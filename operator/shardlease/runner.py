"""The runner: opens and closes shards on the host, and fences them.

Opens and closes run here, in tasks of their own, never in the loop: a slow
open (or a slow store call in the loop) must not delay the other. The runner,
not the loop, owns each shard's deadline (last successful renewal or claim,
measured from when that request was *sent*, + lease_ttl - margin, on the
monotonic clock): the loop may be stuck in a store call, and a shard whose
deadline passes must be closed before its lease can expire in anyone's eyes.

Per shard, the host sees calls strictly in order (one worker task per shard):
open, then close. A shard still waiting for an open slot (`max_concurrency`)
when it is stopped or fenced is never opened.

If the runner's supervisor dies, every worker is cancelled and every open
shard gets a best-effort close; the loop sees the dead task and stops.

The loop hears of every shard the runner is done with (`Ended`), and whether
the host has it closed. A lease is freed only after its shard's close
succeeded: one whose close failed, was abandoned or was cut short is left to
expire (the seed: stop the shard, and only then free the lease, so the next
owner opens a closed database).

A host that learns validities (`LeasedHost`, the HTTP host) is opened with
the shard's validity (its deadline minus now), and told each new one: the
renewals of a pass collect the shards whose deadline moved, and `flush()`
(the end of the pass) sends them in one `extend` call, in a task of its own,
one at a time (a flush while one is in flight joins it: it goes next), each
bounded by `extend_timeout`. A failure is logged and counted, never fatal:
the shards stay collected for the next flush. The supervisor flushes too when
a collected shard's told validity is about to run out (a slow renewal keeps
the pass, and so its flush, from ending). When a fenced close is abandoned,
the host is told to `abort` the shard, in a task of its own.

`reconfigure()` changes the timeouts, the margin, the warning lead and the
number of open slots while shards run. A shard keeps the margin its deadline
was computed with (its lease's expiry is that deadline plus that margin), so
a new margin applies from each shard's next claim or renewal.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from shardlease.clock import Clock
from shardlease.errors import EngineError, OutdatedGeneration, RunnerDied
from shardlease.hosts.base import Host, LeasedHost, Validity
from shardlease.telemetry import (
    Closed,
    DeadlineMoved,
    ExtendFailed,
    Opened,
    Overrun,
    RenewSlow,
    SelfFence,
    Telemetry,
)

logger = logging.getLogger("shardlease.runner")


class State(enum.Enum):
    WAITING = "waiting"  # for an open slot
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Reason(enum.StrEnum):
    """Why a shard was closed; the loop decides from it whether to free the lease."""

    RELEASE = "release"  # above the fair share: free the lease after
    SHUTDOWN = "shutdown"  # graceful stop: free the lease after
    OPEN_FAILED = "open_failed"  # the host could not open it: free the lease after
    #: The host has seen this generation or a newer one (`OutdatedGeneration`):
    #: free the lease with its generation raised to the host's (`highest`).
    OUTDATED = "outdated"
    LOST = "lost"  # someone else holds the lease now: nothing to free
    FENCED = "fenced"  # deadline passed: the lease may be about to expire


@dataclass(frozen=True, slots=True, kw_only=True)
class Ended:
    """What the runner tells the loop when it is done with a shard."""

    shard: int
    #: Why it was stopped.
    reason: Reason
    #: Whether the host has the shard closed: its close succeeded, or it
    #: was never opened. False when the close failed, timed out, was
    #: abandoned at the lease's expiry or cut short by the runner's end: the
    #: host may still have it open, so its lease is not freed before
    #: `expiry` (the seed's rule: stop the shard, and only then free it).
    closed: bool = True
    #: When another node may take the lease, as this node sees it (monotonic):
    #: the deadline given last + the margin it was given with (inf: unbounded).
    expiry: float = math.inf
    #: The host refused the open as outdated (whatever the reason the shard
    #: was stopped for): the highest generation it has seen.
    highest: int | None = None
    #: The host accepted the open: the generation was new to it. A claim
    #: made blind (no generation known) learns only from this, or from a
    #: refusal, that no other node may still have the shard open.
    opened: bool = False


@dataclass(eq=False)
class _Shard:
    shard: int
    generation: int
    deadline: float
    #: The margin `deadline` was computed with: the lease's expiry, in this
    #: node's eyes, is `deadline + margin` (None: unbounded).
    margin: float | None = None
    state: State = State.WAITING
    reason: Reason | None = None
    warned: bool = False  # renew_slow reported for the current deadline
    #: The deadline the host was last told (a `LeasedHost`): the open's or
    #: the last `extend` that succeeded. None: not told yet.
    told: float | None = None
    #: Reason.OUTDATED: the highest generation the host has seen.
    highest: int | None = None
    #: The host accepted its open (`Ended.opened`).
    accepted: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    fenced: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def fence(self) -> None:
        """The deadline passed: stop, and interrupt an open in progress, even
        if the shard was already being stopped for another reason."""
        self.reason = Reason.FENCED
        self.fenced.set()
        self.stop.set()


class _Expired(Exception):
    """A fenced shard's close reached the lease's expiry."""


#: Seconds between close attempts after a failure (doubling, capped).
CLOSE_RETRY_FIRST = 0.5
CLOSE_RETRY_MAX = 10.0
#: Close attempts after a fence: the lease cannot be kept, so closing is best
#: effort; the generation fences a shard the host failed to close.
FENCED_CLOSE_ATTEMPTS = 3


class Runner:
    def __init__(
        self,
        host: Host,
        *,
        cluster: str,
        node: str,
        clock: Clock,
        telemetry: Telemetry,
        max_concurrency: int = 16,
        open_timeout: float = 60.0,
        close_timeout: float = 60.0,
        margin: float | None = None,
        warn_ahead: float = 0.0,
        extend_timeout: float | None = None,
        on_closed: Callable[[Ended], None] | None = None,
    ) -> None:
        self.host = host
        self.cluster = cluster
        self.node = node
        self.clock = clock
        self.telemetry = telemetry
        self.open_timeout = open_timeout
        self.close_timeout = close_timeout
        #: Seconds from a deadline to the lease's expiry (in this node's
        #: eyes): a fenced shard's close gets at most until then, after which
        #: another node may open the shard. None: unbounded (close_timeout).
        self.margin = margin
        #: Seconds before a deadline at which a shard not renewed since is
        #: reported (renew_slow), so that no fence comes unannounced.
        self.warn_ahead = warn_ahead
        self.on_closed = on_closed
        #: The host, if it learns validities (opened with one, then extended).
        self.leased: LeasedHost | None = host if isinstance(host, LeasedHost) else None
        #: Seconds one `extend` call may take (None: the host's own bound).
        self.extend_timeout = extend_timeout
        #: Shards whose deadline moved since the host was last told.
        self._moved: set[int] = set()
        self._flush_wanted = False
        self._extending: asyncio.Task[None] | None = None
        #: Abort calls in flight (best effort; awaited on the way out).
        self._aborting: set[asyncio.Task[None]] = set()
        self._slots = _Slots(max_concurrency)
        self._shards: dict[int, _Shard] = {}
        self._wake = asyncio.Event()
        self._failed: BaseException | None = None
        self._ending = False
        #: Shards whose close was abandoned (an overrun, or a fenced close that
        #: kept failing): the host may still have them open, so the next open
        #: of one is preceded by a close.
        self._unclosed: set[int] = set()

    @property
    def running(self) -> bool:
        """False once the runner is ending (cancelled or dead): it takes no
        new shard, since nothing would close it."""
        return self._failed is None and not self._ending

    @property
    def max_concurrency(self) -> int:
        return self._slots.limit

    # -- the loop's side -------------------------------------------------------

    def reconfigure(self, *, max_concurrency: int, open_timeout: float, close_timeout: float,
                    margin: float | None, warn_ahead: float,
                    extend_timeout: float | None = None) -> None:
        """New options, in place, for the shards running and to come.

        An open or close call already running keeps the timeout it started
        with. A smaller `max_concurrency` lets the opens running finish and
        starts no new one until fewer run; a larger one starts waiting opens
        at once. The margin applies to deadlines given from now on (see
        `_Shard.margin`): the deadlines given so far keep theirs."""
        self.open_timeout = open_timeout
        self.close_timeout = close_timeout
        self.margin = margin
        self.warn_ahead = warn_ahead
        self.extend_timeout = extend_timeout
        self._slots.resize(max_concurrency)
        self._wake.set()  # the warnings' lead may have changed

    def start(self, shard: int, generation: int, deadline: float) -> None:
        """Open a shard just claimed (asynchronously)."""
        if not self.running:
            raise RunnerDied("the runner has stopped") from self._failed
        if shard in self._shards:
            raise EngineError(f"shard {shard} is already in the runner")
        st = _Shard(shard, generation, deadline, self.margin)
        self._shards[shard] = st
        st.task = asyncio.create_task(self._drive(st), name=f"shardlease-shard-{shard}")
        st.task.add_done_callback(self._worker_done)
        self._wake.set()

    def extend(self, shard: int, deadline: float) -> None:
        """A renewal succeeded: move the deadline (never backwards, never for a
        shard already being fenced or closed)."""
        st = self._shards.get(shard)
        if st is not None and st.reason is not Reason.FENCED and deadline > st.deadline:
            st.deadline, st.margin = deadline, self.margin
            st.warned = False
            if self.leased is not None:
                self._moved.add(shard)
            self._wake.set()
            now_m, now_w = self.clock.monotonic(), self.clock.wall()
            self.telemetry.emit(DeadlineMoved(
                cluster=self.cluster, node=self.node, shard=shard, generation=st.generation,
                deadline=deadline, deadline_wall=now_w + (deadline - now_m)))

    def fence(self, shards: list[int]) -> None:
        """Fence these shards now, whatever their deadline (their lease was
        found invalid before it: a node-mode epoch ended by a peer)."""
        fenced = []
        for shard in shards:
            st = self._shards.get(shard)
            if st is not None and st.reason is not Reason.FENCED \
                    and st.state is not State.CLOSED:
                st.deadline = min(st.deadline, self.clock.monotonic())
                st.fence()
                fenced.append(shard)
        if fenced:
            logger.warning("self-fencing shards %s: their lease is no longer valid", fenced)
            self.telemetry.emit(SelfFence(cluster=self.cluster, node=self.node,
                                          shards=tuple(sorted(fenced))))
            self._wake.set()

    def flush(self) -> None:
        """Tell the host the validity of every shard whose deadline moved since
        it was last told (a `LeasedHost`; the loop calls this at the end of
        each renewal pass). Never waits: the call runs in a task of its own,
        and a flush while one is in flight goes next."""
        if self.leased is None or not self._moved or not self.running:
            return
        self._flush_wanted = True
        if self._extending is None or self._extending.done():
            self._extending = asyncio.create_task(self._extend_passes(self.leased),
                                                  name="shardlease-extend")

    async def _extend_passes(self, host: LeasedHost) -> None:
        while self._flush_wanted and self._moved:
            self._flush_wanted = False
            now = self.clock.monotonic()
            batch: dict[int, Validity] = {}
            told: dict[int, _Shard] = {}
            for shard in sorted(self._moved):
                st = self._shards.get(shard)
                # A shard not opened yet learns its validity with the open.
                if st is None or st.state in (State.WAITING, State.CLOSED) \
                        or st.reason is Reason.FENCED or st.deadline <= now:
                    continue
                batch[shard] = Validity(st.generation, st.deadline - now)
                told[shard] = st
            self._moved.clear()
            if not batch:
                continue
            try:
                async with asyncio.timeout(self.extend_timeout):
                    await host.extend(batch)
            except Exception as e:
                why = str(e) or type(e).__name__
                if isinstance(e, TimeoutError):
                    why = f"no answer within {self.extend_timeout:g}s"
                logger.warning("could not tell the host the validity of shards %s: %s",
                               sorted(batch), why)
                self.telemetry.emit(ExtendFailed(cluster=self.cluster, node=self.node,
                                                 shards=tuple(sorted(batch)), error=why))
                # Retried with the next flush (with their validity then).
                self._moved.update(s for s, st in told.items() if self._shards.get(s) is st)
                return
            for st in told.values():
                told_deadline = now + batch[st.shard].seconds
                st.told = told_deadline if st.told is None else max(st.told, told_deadline)

    def _abort_at_host(self, st: _Shard) -> None:
        """A fenced close was abandoned: tell the host to drop the shard now
        (a `LeasedHost`), without waiting for it."""
        if self.leased is None:
            return
        task = asyncio.create_task(self._send_abort(self.leased, st.shard, st.generation),
                                   name=f"shardlease-abort-{st.shard}")
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)

    async def _send_abort(self, host: LeasedHost, shard: int, generation: int) -> None:
        try:
            async with asyncio.timeout(self.close_timeout):
                await host.abort(shard, generation)
        except Exception as e:
            logger.warning("could not tell the host to abort shard %d (generation %d): %s",
                           shard, generation, e or type(e).__name__)

    def stop(self, shard: int, reason: Reason) -> None:
        """Close a shard (after its open, if one is running)."""
        st = self._shards.get(shard)
        if st is not None and st.reason is None:
            st.reason = reason
            st.stop.set()

    def state(self, shard: int) -> State | None:
        st = self._shards.get(shard)
        return None if st is None else st.state

    def deadline(self, shard: int) -> float | None:
        st = self._shards.get(shard)
        return None if st is None else st.deadline

    def shards(self) -> dict[int, State]:
        return {s: st.state for s, st in self._shards.items()}

    # -- the supervisor ----------------------------------------------------------

    async def run(self) -> None:
        """Watch the deadlines until cancelled. Fences shards whose deadline passed."""
        try:
            while True:
                self._wake.clear()
                if self._failed is not None:
                    raise RunnerDied("a shard worker failed") from self._failed
                now = self.clock.monotonic()
                self._warn(now)  # before any fence, also one due at this same instant
                fenced = []
                for st in self._shards.values():
                    if st.reason is not Reason.FENCED and st.state is not State.CLOSED \
                            and st.deadline <= now:
                        st.fence()
                        fenced.append(st.shard)
                if fenced:
                    logger.warning("self-fencing shards %s: no renewal before their deadline",
                                   fenced)
                    self.telemetry.emit(SelfFence(cluster=self.cluster, node=self.node,
                                                  shards=tuple(sorted(fenced))))
                pending = [st.deadline - (0.0 if st.warned else self.warn_ahead)
                           for st in self._shards.values()
                           if st.reason is not Reason.FENCED and st.state is not State.CLOSED]
                pending += self._flush_if_due(now)
                timeout = max(0.0, min(pending) - now) if pending else None
                # Not asyncio.wait_for: on Python 3.11 it loses a cancellation
                # that arrives just as the wake-up comes (the runner would then
                # never end, and a graceful stop would hang on it).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        finally:
            self._ending = True
            await self._abort()

    def _flush_if_due(self, now: float) -> list[float]:
        """Flush now if a shard waiting to be told has less than `warn_ahead`
        of its told validity left (its pass has not ended: a slow renewal of
        another shard); the times at which one will have, to wake up then."""
        later = []
        due = False
        for shard in self._moved:
            st = self._shards.get(shard)
            if st is None or st.told is None or st.reason is Reason.FENCED:
                continue
            if st.told - self.warn_ahead <= now:
                due = True
            else:
                later.append(st.told - self.warn_ahead)
        if due:
            self.flush()
        return later

    def _warn(self, now: float) -> None:
        """Report the shards whose deadline is less than `warn_ahead` away:
        their renewals are late (failing, or slower than the store allows)."""
        if self.warn_ahead <= 0:
            return
        late = [st for st in self._shards.values()
                if not st.warned and st.reason is not Reason.FENCED
                and st.state is not State.CLOSED and st.deadline - self.warn_ahead <= now]
        if not late:
            return
        for st in late:
            st.warned = True
        left = max(0.0, min(st.deadline for st in late) - now)
        shards = tuple(sorted(st.shard for st in late))
        logger.warning("renewals of shards %s are late: fenced in %.3gs unless one lands",
                       list(shards), left)
        self.telemetry.emit(RenewSlow(cluster=self.cluster, node=self.node, shards=shards,
                                      left=left))

    async def _abort(self) -> None:
        """The supervisor is ending (cancelled or died): stop workers, then
        close what may be open, so nothing stays open unfenced. The closes run
        at once, each bounded by its lease's expiry."""
        workers = [st.task for st in self._shards.values() if st.task and not st.task.done()]
        if self._extending is not None:
            workers.append(self._extending)
        for t in workers:
            t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

        async def close(st: _Shard) -> None:
            closed = False
            try:
                await self._close_once(st, until=self._expiry(st))
                self._unclosed.discard(st.shard)
                closed = True
            except _Expired:
                self._overrun(st)
            except Exception as e:
                logger.warning("close of shard %d failed on the way out: %s", st.shard,
                               e or type(e).__name__)
            self._finish(st, st.reason or Reason.SHUTDOWN, closed=closed)

        # Cancelled again meanwhile (the loop bounds this: a second signal
        # ends the process within an interval), a close cut short reports
        # nothing: its lease, still held, is left to expire.
        await asyncio.gather(*(close(st) for st in list(self._shards.values())
                               if st.state in (State.OPENING, State.OPEN, State.CLOSING)))
        for st in list(self._shards.values()):
            if st.state is State.WAITING:
                # Never opened: nothing to close, unless an earlier close of
                # the shard was abandoned (the host may have that one open).
                self._finish(st, st.reason or Reason.SHUTDOWN,
                             closed=st.shard not in self._unclosed)
        # The aborts just sent (each bounded): the application should hear them.
        await asyncio.gather(*self._aborting, return_exceptions=True)

    def _expiry(self, st: _Shard) -> float:
        """When another node may take the shard's lease, as this node sees it."""
        return math.inf if st.margin is None else st.deadline + st.margin

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failed is None:
            self._failed = task.exception()
            self._wake.set()

    # -- one shard ---------------------------------------------------------------

    def _past_deadline(self, st: _Shard) -> bool:
        return st.deadline <= self.clock.monotonic()

    async def _drive(self, st: _Shard) -> None:
        if st.shard in self._unclosed and not await self._close_abandoned(st):
            # The host may have the shard open still (an earlier generation):
            # not closed, so its new lease is not freed before it expires.
            self._finish(st, st.reason or Reason.OPEN_FAILED, closed=False)
            return
        opened = await self._open(st)
        if opened:
            st.state = State.OPEN
            st.accepted = True
            now_m, now_w = self.clock.monotonic(), self.clock.wall()
            self.telemetry.emit(Opened(cluster=self.cluster, node=self.node, shard=st.shard,
                                       generation=st.generation, deadline=st.deadline,
                                       deadline_wall=now_w + (st.deadline - now_m)))
            await st.stop.wait()
        closed = True
        if st.state in (State.OPENING, State.OPEN):
            closed = await self._close(st)
        self._finish(st, st.reason or Reason.OPEN_FAILED, closed=closed)

    async def _close_abandoned(self, st: _Shard) -> bool:
        """Close at the host a shard whose last close was abandoned, before
        opening it again: the host never sees two opens without a close.
        Within the new lease's deadline; False if it failed (no open then)."""
        try:
            await self._close_once(st, until=st.deadline)
        except Exception as e:  # _Expired too
            logger.warning("shard %d: closing what an abandoned close left open failed, "
                           "not opening it: %s", st.shard, e or "past the deadline")
            return False
        self._unclosed.discard(st.shard)
        return True

    async def _open(self, st: _Shard) -> bool:
        """Open the shard unless it is stopped or fenced first. True when open."""
        slot = asyncio.create_task(self._slots.acquire())
        stopped = asyncio.create_task(st.stop.wait())
        try:
            await asyncio.wait({slot, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not slot.done() or st.stop.is_set() or self._past_deadline(st):
            if slot.done() and not slot.cancelled():
                self._slots.release()
            else:
                slot.cancel()
                # The slot may have been granted while being cancelled.
                with contextlib.suppress(asyncio.CancelledError):
                    await slot
                if slot.done() and not slot.cancelled():
                    self._slots.release()
            if st.reason is None:
                st.reason = Reason.FENCED
            return False
        try:
            st.state = State.OPENING
            opening = asyncio.create_task(self._open_call(st))
            fence = asyncio.create_task(self._until_fenced(st))
            try:
                done, _ = await asyncio.wait({opening, fence}, timeout=self.open_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                # Cancelled (the runner is ending): the open must end before
                # anyone closes the shard, or the host would see a close
                # during the open, and the open could land after the close.
                opening.cancel()
                with contextlib.suppress(BaseException):
                    await opening
                raise
            finally:
                fence.cancel()
            if opening not in done:
                # Fenced or timed out mid-open: cancel it; the close that
                # follows leaves the shard closed at the host.
                opening.cancel()
                with contextlib.suppress(BaseException):
                    await opening
                why = "fenced" if st.reason is Reason.FENCED else "timed out"
                logger.warning("open of shard %d %s", st.shard, why)
                if st.reason is None:
                    st.reason = Reason.OPEN_FAILED
                return False
            if (exc := opening.exception()) is not None:
                logger.warning("open of shard %d failed: %s", st.shard, exc)
                if isinstance(exc, OutdatedGeneration):
                    # Also when a stop or a release came during the open: the
                    # host has seen `highest`, and the free must say so and
                    # keep the shard from everyone as long (issue 38, A1).
                    st.highest = exc.highest
                    if st.reason is None:
                        st.reason = Reason.OUTDATED
                elif st.reason is None:
                    st.reason = Reason.OPEN_FAILED
                return False
            return True
        finally:
            self._slots.release()

    def _open_call(self, st: _Shard) -> Coroutine[Any, Any, None]:
        """The host's open; with the shard's validity if the host learns it."""
        if self.leased is None:
            return self.host.open(st.shard, st.generation)
        st.told = st.deadline
        self._moved.discard(st.shard)
        return self.leased.open_for(st.shard, st.generation,
                                    st.deadline - self.clock.monotonic())

    async def _until_fenced(self, st: _Shard) -> None:
        # Stopped for another reason while opening, the open may finish (and
        # is then closed); only a fence interrupts an open -- also one that
        # comes after such a stop.
        await st.fenced.wait()

    async def _close(self, st: _Shard) -> bool:
        """Close, retrying on failure. The lease is kept (and renewed by the
        loop) until this returns, unless the shard is fenced: then the close
        gets until the lease's expiry, and is abandoned there (an overrun),
        or earlier after FENCED_CLOSE_ATTEMPTS failures. True if the host
        closed it; False if it was given up (the lease is then left to
        expire: never freed before its expiry)."""
        st.state = State.CLOSING
        delay = CLOSE_RETRY_FIRST
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._close_once(st)
                self._unclosed.discard(st.shard)
                return True
            except _Expired:
                self._overrun(st)
                return False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.warning("close of shard %d failed (attempt %d): %s", st.shard, attempt, e)
            if st.reason is Reason.FENCED and attempt >= FENCED_CLOSE_ATTEMPTS:
                logger.error("giving up closing fenced shard %d; the generation fences it",
                             st.shard)
                self._unclosed.add(st.shard)
                self._abort_at_host(st)
                return False
            # Never past the lease's expiry: a fenced close ends there.
            await asyncio.sleep(max(0.0, min(delay, self._expiry(st) - self.clock.monotonic())))
            delay = min(delay * 2, CLOSE_RETRY_MAX)
            if self._past_deadline(st) and st.reason is not Reason.FENCED:
                # (Said as the watchdog says it, which skips a shard fenced
                # here: regression seed-3736343863, a lost shard whose close
                # kept failing past its deadline, closed for a fence unsaid.)
                st.fence()
                logger.warning("self-fencing shard %d: its deadline passed while its close "
                               "kept failing", st.shard)
                self.telemetry.emit(SelfFence(cluster=self.cluster, node=self.node,
                                              shards=(st.shard,)))
            if st.reason is Reason.FENCED and self.clock.monotonic() >= self._expiry(st):
                self._overrun(st)
                return False

    async def _close_once(self, st: _Shard, until: float | None = None) -> None:
        """One close call, within `close_timeout`, and -- once the shard is
        fenced, even during the call -- within its lease's expiry (or `until`):
        past it the call is cancelled and `_Expired` raised."""
        closing = asyncio.create_task(self.host.close(st.shard))
        fenced = asyncio.create_task(st.fenced.wait())
        end_try = self.clock.monotonic() + self.close_timeout
        try:
            while True:
                bounded = until is not None or st.fenced.is_set()
                expiry = until if until is not None else self._expiry(st)
                end = min(end_try, expiry) if bounded else end_try
                waiting = {closing} if bounded else {closing, fenced}
                await asyncio.wait(waiting, timeout=max(0.0, end - self.clock.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
                if closing.done():
                    return closing.result()
                now = self.clock.monotonic()
                if now >= end:
                    closing.cancel()
                    with contextlib.suppress(BaseException):
                        await closing
                    if bounded and now >= expiry:
                        raise _Expired
                    raise TimeoutError(f"close of shard {st.shard} took over "
                                       f"{self.close_timeout:g}s")
        except BaseException:
            # Cancelled (the runner is ending): the call must end before any
            # other call of this shard reaches the host.
            if not closing.done():
                closing.cancel()
                with contextlib.suppress(BaseException):
                    await closing
            raise
        finally:
            fenced.cancel()

    def _overrun(self, st: _Shard) -> None:
        self._unclosed.add(st.shard)
        late = self.clock.monotonic() - st.deadline
        logger.error("close of fenced shard %d did not end before its lease could be taken "
                     "(%.3gs after the deadline): abandoned; the generation fences it",
                     st.shard, late)
        self.telemetry.emit(Overrun(cluster=self.cluster, node=self.node, shard=st.shard,
                                    generation=st.generation, late=late))
        self._abort_at_host(st)

    def _finish(self, st: _Shard, reason: Reason, *, closed: bool = True) -> None:
        """Done with the shard: `closed` says whether the host has it closed
        (see `Ended`)."""
        if st.state is State.CLOSED:
            return
        st.state = State.CLOSED
        st.reason = reason
        if self._shards.get(st.shard) is st:
            del self._shards[st.shard]
            self._moved.discard(st.shard)
        self.telemetry.emit(Closed(cluster=self.cluster, node=self.node, shard=st.shard,
                                   reason=reason.value))
        if not closed:
            logger.error("shard %d (generation %d) may still be open at the host (its close "
                         "did not succeed): its lease is left to expire, never freed before "
                         "then", st.shard, st.generation)
        if self.on_closed is not None:
            self.on_closed(Ended(shard=st.shard, reason=reason, closed=closed,
                                 expiry=self._expiry(st),
                                 highest=st.highest, opened=st.accepted))
        self._wake.set()


class _Slots:
    """The open slots: a semaphore whose size can change while it is in use
    (`resize`). Waiters are served first come, first served; a waiter
    cancelled once its slot was granted gives the slot back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> None:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted as it was cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self.used -= 1
        self._grant()

    def resize(self, limit: int) -> None:
        self.limit = limit
        self._grant()

    def _grant(self) -> None:
        while self.used < self.limit and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.used += 1
                waiter.set_result(None)
