"""The per-pod controller (`shardlease agent`), on kopf.

kopf watches this pod's ShardSet and the pods of the namespace (peer
discovery) with stateless event handlers, so nothing is written onto any
object to remember progress. The placement loop runs beside kopf in a task
the agent supervises. A spec change is applied in place (`leaseTTL`,
`interval`, `margin`, `maxConcurrency`, `shards`, the host's URL and
timeouts: `PlacementLoop.reconfigure`, no shard closed but those a smaller
`shards` leaves out); only a change of `store` or `renewal` restarts the loop
gracefully (every shard closed, every lease freed, then taken again).
A store that is unreachable at start is retried with a Warning Event, never a
silent crash.

SIGTERM (kopf's cleanup) or `/drain` (the application containers' preStop
hook, injected by the operator) closes every shard and frees every lease
before the pod goes away. A drain while the pod is not being deleted (the
kubelet restarting the application after a failed probe) is a pause: the
shards are handed off and taken again once the application restarted
(see k8s/drain.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import kopf
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from pydantic import ValidationError

from shardlease.errors import ConfigError, ShardleaseError, StoreError
from shardlease.errors import LoopDied as LoopDied  # (re-exported: its old home)
from shardlease.hints import HintChannel
from shardlease.hosts.http import HttpHost
from shardlease.k8s import hold
from shardlease.k8s.discovery import Peers
from shardlease.k8s.drain import ANNOUNCE_WAIT, KILLING, restart_counts, restarted, verdict
from shardlease.k8s.hold import Hold
from shardlease.k8s.inject import AGENT
from shardlease.k8s.login import identity, register_login
from shardlease.k8s.spec import ShardSetSpec
from shardlease.k8s.status import (
    REFRESH_INTERVALS,
    build_status,
    comparable,
    highest,
    merge_conditions,
    published_generations,
)
from shardlease.kubeapi import KubeClient
from shardlease.loop import PlacementLoop
from shardlease.proc import process_age
from shardlease.routing import shard_for_key
from shardlease.stores import open_store
from shardlease.telemetry import (
    Claim,
    Event,
    EventLog,
    LeftToExpire,
    Lost,
    NewerRecord,
    PrometheusMetrics,
    Release,
    RenewFailed,
    Round,
    SelfFence,
    Telemetry,
)

logger = logging.getLogger("shardlease.agent")

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
RETRY_FIRST, RETRY_MAX = 2.0, 60.0
HOST_POLL = 0.5


async def _say_ready(loop: PlacementLoop, run: asyncio.Task[None], checked: float,
                     listening: float, age: float | None) -> None:
    """Log once how long the loop took to be ready, from the store's answer
    (its start-up check) and the application listening (what the agent
    itself costs), and what came before: the process's start to the store's
    answer (`age`: interpreter, imports, login, the ShardSet), then the wait
    for the application. Nothing if the loop ends first (it failed, or a
    new spec replaced it)."""
    ready = asyncio.ensure_future(loop.ready.wait())
    try:
        await asyncio.wait({ready, run}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ready.cancel()
    if not loop.ready.is_set():
        return
    before = f"the store answered {age:.2f}s after the process started, " if age else ""
    logger.info("ready: %.2fs after the store answered and the application listened "
                "(%sthe application listened %.2fs later)",
                time.monotonic() - listening, before, listening - checked)


def agent_metrics(telemetry: Telemetry) -> CollectorRegistry:
    """The registry an agent serves on /metrics (docs/metrics.md is made from
    it): a registry per agent, not the process-wide one, since two agents in
    one process (tests, an app embedding it) would register every metric twice."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    telemetry.subscribe(PrometheusMetrics(registry))
    return registry


class Agent:
    def __init__(self, *, namespace: str, shardset: str, pod_name: str, port: int = 8470,
                 host_url: str | None = None, kubeconfig: str | None = None) -> None:
        self.namespace = namespace
        self.shardset = shardset
        self.pod_name = pod_name
        self.port = port
        self.host_url = host_url
        self.kubeconfig = kubeconfig
        #: How long a drain waits for the kubelet's word (k8s/drain.py).
        self.announce_wait = ANNOUNCE_WAIT
        #: The drains' one look at the API server in progress, and until when
        #: it looks (loop time): see `_look`.
        self._looking: asyncio.Future[tuple[str, str, dict[str, Any] | None]] | None = None
        self._look_until = -math.inf
        self.peers = Peers()
        #: This pod as the watch last showed it (for drains: deletion, restarts).
        self.own_pod: dict[str, Any] | None = None
        self._own_pod_changed = asyncio.Event()
        #: Set while a drain that is not the pod's end holds the loop stopped.
        self._resume: asyncio.Event | None = None
        #: When (monotonic) this pod was first asked to stop or to pause: the
        #: kubelet's grace period runs from about then (k8s/hold.py read_budget).
        self._stop_began: float | None = None
        self._paused = asyncio.Event()
        self.body: dict[str, Any] | None = None
        self.spec: ShardSetSpec | None = None
        self.loop: PlacementLoop | None = None
        self.telemetry = Telemetry()
        self.telemetry.subscribe(EventLog())
        self.metrics = agent_metrics(self.telemetry)
        self.telemetry.subscribe(self._collect_event)
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._pending_events: list[Event] = []
        self._published: dict[str, Any] | None = None
        #: The highest generation per shard of this agent's earlier loops.
        self._generations: dict[int, int] = {}
        self._last_publish = 0.0
        self._api: KubeClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._web: web.AppRunner | None = None
        self._supervisor: asyncio.Task[None] | None = None
        #: Why the loop died, once it has: the agent is then not alive.
        self.died: LoopDied | None = None
        self.registry = kopf.OperatorRegistry()
        self._register()

    # -- kopf ------------------------------------------------------------------

    def _register(self) -> None:
        reg = self.registry

        @kopf.on.startup(registry=reg)
        async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.scanning.disabled = True
            settings.posting.enabled = False  # we post aggregated Events ourselves
            settings.watching.server_timeout = 300
            await self.start()

        register_login(reg, self.kubeconfig)

        @kopf.on.cleanup(registry=reg)
        async def cleanup(**_: Any) -> None:
            await self.shutdown()
            await self.close()

        # Async, though they never await: kopf runs a sync handler in a
        # thread pool, and these set the Events the supervisor waits on and
        # fill the peer table the loop iterates (tests/kube/test_agent_handlers.py).
        @kopf.on.event(GROUP, VERSION, PLURAL, registry=reg,
                       when=lambda name, **_: name == self.shardset)
        async def shardset_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            self.on_shardset(type, dict(body))

        @kopf.on.event("", "v1", "pods", registry=reg)
        async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            pod = dict(body)
            self.peers.observe(type, pod)
            if (pod.get("metadata") or {}).get("name") == self.pod_name:
                self.own_pod = None if type == "DELETED" else pod
                self._own_pod_changed.set()

    async def run(self) -> None:
        """Run kopf (which calls start/shutdown) until SIGTERM."""
        await kopf.operator(registry=self.registry, standalone=True, clusterwide=False,
                            namespaces=[self.namespace],
                            identity=identity(self.pod_name))

    # -- lifecycle -------------------------------------------------------------

    @property
    def api(self) -> KubeClient:
        if self._api is None:
            raise RuntimeError("the agent's API client is made by start()")
        return self._api

    async def start(self) -> None:
        self._api = KubeClient.from_config(self.kubeconfig)
        await self._serve()
        self._supervisor = self._spawn(self._supervise(), "supervisor")
        self._spawn(self._publish_status(), "status")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"shardlease-agent-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _began_stopping(self, at: float | None) -> None:
        at = time.monotonic() if at is None else at
        self._stop_began = at if self._stop_began is None else min(self._stop_began, at)

    async def shutdown(self, asked: float | None = None) -> None:
        """Close every shard and free every lease; idempotent. `asked`: when
        (monotonic) the stop was asked for, if before now (a drain's request)."""
        self._began_stopping(asked)
        self._stopping.set()
        self._changed.set()
        if self._resume is not None:
            self._resume.set()
        await self._stopped.wait()

    async def pause(self, before: dict[str, int], resume_after: float,
                    asked: float | None = None) -> None:
        """Stop the loop (close every shard, free every lease) until one of the
        containers counted in `before` restarted, or `resume_after` seconds passed."""
        self._began_stopping(asked)
        if self._resume is None:
            resume = self._resume = asyncio.Event()
            self._paused.clear()
            self._changed.set()
            self._spawn(self._resume_after_restart(resume, before, resume_after), "resume")
        paused = asyncio.create_task(self._paused.wait())
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({paused, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            paused.cancel()
            stopped.cancel()

    async def _resume_after_restart(self, resume: asyncio.Event, before: dict[str, int],
                                    resume_after: float) -> None:
        deadline = asyncio.get_running_loop().time() + resume_after
        while not resume.is_set():
            if restarted(before, self.own_pod, AGENT):
                logger.info("the application restarted after the drain: taking shards again")
                break
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                logger.info("no container restarted within %.0fs of the drain: "
                            "taking shards again", resume_after)
                break
            self._own_pod_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._own_pod_changed.wait()
        resume.set()

    async def close(self) -> None:
        # Events already being posted (the last round's releases) go out
        # first: cancelling them would hide the hand-off from `kubectl get events`.
        posting = [t for t in self._tasks if t.get_name().endswith("-events")]
        if posting:
            await asyncio.wait(posting, timeout=5.0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._web is not None:
            await self._web.cleanup()
        if self._api is not None:
            await self._api.close()

    def on_shardset(self, event_type: str | None, body: dict[str, Any]) -> None:
        if event_type == "DELETED":
            logger.warning("ShardSet %s was deleted: releasing every shard", self.shardset)
            self.body, self.spec = None, None
            self._changed.set()
            return
        self.body = body
        try:
            spec = ShardSetSpec.model_validate(body.get("spec") or {})
        except ValidationError as e:
            logger.error("ShardSet %s has an invalid spec, keeping the last good one: %s",
                         self.shardset, e)
            return
        if spec != self.spec:
            self.spec = spec
            self.peers.selector = dict(spec.selector)
            self._changed.set()

    async def _supervise(self) -> None:
        delay = RETRY_FIRST
        try:
            while not self._stopping.is_set():
                resume = self._resume
                if resume is not None:
                    self._paused.set()
                    await resume.wait()
                    self._resume = None
                    if not self._stopping.is_set():
                        self._stop_began = None  # the pause is over: no grace runs
                    self._paused.clear()
                    continue
                spec = self.spec
                if spec is None:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                try:
                    await self._run_loop(spec)
                    delay = RETRY_FIRST
                except LoopDied as e:
                    # The engine itself broke (its runner died, a bug): every
                    # shard is closed by now. Liveness fails so the kubelet
                    # restarts this container, rather than limping on.
                    self.died = e
                    logger.error("%s: /healthz now fails so the container restarts", e)
                    await self._post("Warning", "LoopDied", str(e))
                    return
                except (ShardleaseError, ValidationError) as e:
                    msg = f"cannot run the placement loop: {e}"
                    logger.error("%s (retrying in %.0fs)", msg, delay)
                    await self._post("Warning", "LoopFailed", msg)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._changed.wait()
                    delay = min(delay * 2, RETRY_MAX)
        finally:
            self._stopped.set()

    async def _run_loop(self, spec: ShardSetSpec) -> None:
        self._changed.clear()
        options = spec.options(name=self.pod_name, cluster=self.shardset)
        store = open_store(spec.store)
        host = HttpHost(self.host_url or spec.host.url, open_timeout=options.open_timeout,
                        close_timeout=options.close_timeout)
        hints: HintChannel | None = None
        unsubscribe: Callable[[], None] | None = None
        try:
            await store.check()
            checked, age = time.monotonic(), process_age()
            if not await self._host_listening(self.host_url or spec.host.url):
                return  # stopping, or the ShardSet changed while we waited
            loop = PlacementLoop(store, host, options, peers=self.peers.names,
                                 telemetry=self.telemetry)
            listening = time.monotonic()
            # What was handed out before, in this store or one it replaced,
            # as the ShardSet's status tells and this agent saw: its claims
            # go above (the application refusing an old generation is the
            # last word; this spares it the refusals, docs/renewal.md rule 14).
            loop.known_generations(highest(
                published_generations((self.body or {}).get("status")), self._generations))
            self.loop = loop
            if not store.watches:
                hints, unsubscribe = await self._start_hints(loop, options.cluster_name)
            task = asyncio.create_task(loop.run(), name="shardlease-loop")
            self._spawn(_say_ready(loop, task, checked, listening, age), "ready")
            applied: ShardSetSpec | None = spec
            #: The spec in force (the last applied): what a stop's hold is read from.
            current = spec
            while applied is not None and not task.done():
                changed = asyncio.create_task(self._changed.wait())
                try:
                    await asyncio.wait({task, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if not task.done():
                    applied = await self._apply_in_place(loop, host, applied)
                    current = applied or current
            if not task.done():
                why = "stopping" if self._stopping.is_set() else \
                    "draining" if self._resume is not None else \
                    "the ShardSet was deleted" if self.spec is None else \
                    "the ShardSet's store or renewal changed (a restart of the loop)"
                decided, told = await self._hold(current, why) \
                    if why in ("stopping", "draining") else (None, None)
                held = decided.seconds if decided else 0.0
                logger.info("%s: closing every shard and freeing its lease%s", why,
                            f", kept for this pod's name for {held:g}s (handoff: hold)"
                            if held else "")
                await loop.stop(held)
                if told is not None:  # told while the shards closed; a stuck post is let go
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(3.0):
                            await asyncio.shield(told)
            try:
                await task
            except asyncio.CancelledError:
                raise
            except Exception as e:
                raise LoopDied(f"the placement loop died: {type(e).__name__}: {e}") from e
        finally:
            # What the last rounds did (a stop frees every lease after the
            # last round that would have posted it): tell it before going.
            if self._pending_events:
                pending, self._pending_events = self._pending_events, []
                try:
                    async with asyncio.timeout(5.0):
                        await self._post_batch(pending)
                except Exception as e:
                    logger.warning("could not post the last events: %r", e)
            if self.loop is not None:
                self._generations = highest(self._generations, self.loop.highest_generations())
            if unsubscribe is not None:
                unsubscribe()
            if hints is not None:
                await hints.aclose()
            await store.aclose()
            await host.aclose()

    async def _start_hints(self, loop: PlacementLoop, cluster: str) -> tuple[
            HintChannel | None, Callable[[], None] | None]:
        """A store with no watch (S3): hint the peers' agents (UDP, on the
        agent's port number) when this pod frees leases or joins, and wake
        this loop on theirs. Without it nothing breaks: freed shards reopen
        at their next owner's next round."""
        def addresses() -> dict[str, str]:
            return {name: f"{ip}:{self.port}" for name in self.peers.names()
                    if (ip := self.peers.address(name))}

        hints = HintChannel(cluster=cluster, name=self.pod_name, listen=("0.0.0.0", self.port),
                            peers=addresses, on_hint=loop.hint)
        try:
            await hints.start()
        except ConfigError as e:
            logger.warning("no hints to and from peers: %s", e)
            return None, None
        return hints, self.telemetry.subscribe(hints.on_event)

    async def _apply_in_place(self, loop: PlacementLoop, host: HttpHost,
                              current: ShardSetSpec) -> ShardSetSpec | None:
        """The ShardSet changed (or the agent is told to stop or drain): apply
        the new spec to the running loop and host, and return it; None when
        the loop must stop instead (stopping, draining, the ShardSet deleted,
        its store changed: the leases are elsewhere, so every shard is closed
        and taken again from the new store; or its renewal mode changed)."""
        self._changed.clear()
        new = self.spec
        if self._stopping.is_set() or self._resume is not None or new is None:
            return None
        if new.store != current.store:
            logger.warning("the ShardSet's store changed (%s -> %s): restarting the placement "
                           "loop, which closes every shard on this pod", current.store, new.store)
            return None
        if new.renewal != current.renewal:
            logger.warning("the ShardSet's renewal changed (%s -> %s): restarting the placement "
                           "loop, which closes every shard on this pod", current.renewal,
                           new.renewal)
            return None
        changes = spec_changes(current, new)
        if self.host_url:  # --host-url wins over the spec's
            changes = [c for c in changes if not c.startswith("host.url ")]
        if not changes:
            return new  # the selector (peer discovery has it) or the StatefulSet's name
        try:
            options = new.options(name=self.pod_name, cluster=self.shardset)
            loop.reconfigure(options)
        except ShardleaseError as e:
            msg = f"{self.pod_name} cannot apply the ShardSet change, keeping the last: {e}"
            logger.error("%s", msg)
            await self._post("Warning", "ReconfigureFailed", msg)
            return current
        host.configure(self.host_url or new.host.url, open_timeout=options.open_timeout,
                       close_timeout=options.close_timeout)
        msg = f"{self.pod_name} applied in place (no restart): {', '.join(changes)}"
        logger.info("%s", msg)
        await self._post("Normal", "Reconfigured", msg)
        return new

    async def _host_listening(self, url: str) -> bool:
        """Wait until the application accepts connections at `url`: as a native
        sidecar the agent starts before it, and every open sent meanwhile
        would fail and leave the shard unowned. False if told to stop first."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        waited = False
        while not self._stopping.is_set() and not self._changed.is_set():
            try:
                async with asyncio.timeout(2.0):
                    _, writer = await asyncio.open_connection(parts.hostname, port)
            except (OSError, TimeoutError):
                if not waited:
                    logger.info("waiting for the application to listen at %s before "
                                "taking shards", url)
                    waited = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HOST_POLL):
                        await self._changed.wait()
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if waited:
                logger.info("the application listens at %s", url)
            return True
        return False

    # -- status ----------------------------------------------------------------

    async def _publish_status(self) -> None:
        while True:
            loop, spec = self.loop, self.spec
            interval = loop.options.interval_s if loop else 5.0
            await asyncio.sleep(interval)
            if loop is None or spec is None or not loop.ready.is_set() or 0 not in loop.held:
                continue
            refresh = time.monotonic() - self._last_publish >= REFRESH_INTERVALS * interval
            try:
                if await self.publish_once(loop, spec, refresh=refresh):
                    self._last_publish = time.monotonic()
            except Exception as e:  # never let publishing kill the agent
                logger.warning("could not publish the ShardSet status: %s", e)

    async def publish_once(self, loop: PlacementLoop, spec: ShardSetSpec,
                           refresh: bool = False) -> bool:
        """Publish the owners if they changed (or `refresh`: to move
        observedTime, which says the status is alive).

        A server-side apply as the field manager `shardlease-agent`: whichever
        pod publishes, it owns the same fields (owners, generations, nodes,
        the Balanced and Degraded conditions), and the API server keeps every
        other writer's conditions (the operator's Configured, AgentsInjected
        and Ready) however stale this pod's copy of the object is."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.shardset}"
        body = self.body or {}
        meta = body.get("metadata") or {}
        status = build_status(loop.owners(), loop.live_nodes(), spec.shards,
                              meta.get("generation"), self.pod_name,
                              highest(published_generations(body.get("status")),
                                      self._generations, loop.highest_generations()))
        if not refresh and self._published is not None and \
                comparable(status) == comparable(self._published):
            return False
        ours = {c["type"] for c in status["conditions"]}
        status["conditions"] = [
            c for c in merge_conditions(status["conditions"],
                                        (body.get("status") or {}).get("conditions"),
                                        meta.get("generation"))
            if c["type"] in ours]
        # A map or list that empties out is left out of the apply (the server
        # then drops the field this manager owned): applied as {} or [] after
        # having entries, it reaches validation as null and the whole status
        # is refused (422).
        applied = {k: v for k, v in status.items() if v not in ({}, [])}
        apply = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
                 "metadata": {"name": self.shardset, "namespace": self.namespace},
                 "status": applied}
        code, answer = await self.api.call("PATCH", path + "/status", apply,
                                  "application/apply-patch+yaml",
                                  query=[("fieldManager", "shardlease-agent"),
                                         ("force", "true")])
        if code != 200:
            raise StoreError(f"status apply refused: {code} {answer.get('message', '')}")
        self._published = status
        self.body = answer
        return True

    # -- Kubernetes Events -------------------------------------------------------

    def _collect_event(self, event: Event) -> None:
        if isinstance(event, Claim | Release | Lost | SelfFence | RenewFailed | NewerRecord
                      | LeftToExpire):
            self._pending_events.append(event)
        elif isinstance(event, Round) and self._pending_events:
            pending, self._pending_events = self._pending_events, []
            self._spawn(self._post_batch(pending), "events")

    async def _post_batch(self, events: list[Event]) -> None:
        """One Event per kind per round: a rebalance of 500 shards is one line."""
        claims = sorted(e.shard for e in events if isinstance(e, Claim))
        releases = sorted(e.shard for e in events if isinstance(e, Release))
        lost = sorted(e.shard for e in events if isinstance(e, Lost))
        fenced = sorted(s for e in events if isinstance(e, SelfFence) for s in e.shards)
        failed = [e for e in events if isinstance(e, RenewFailed)]
        newer = sorted({e.shard for e in events if isinstance(e, NewerRecord)})
        unclosed = sorted({e.shard for e in events if isinstance(e, LeftToExpire)})
        me = self.pod_name
        if claims:
            await self._post("Normal", "Claimed", f"{me} claimed shard(s) {_ranges(claims)}")
        if releases:
            await self._post("Normal", "Released", f"{me} released shard(s) {_ranges(releases)}")
        if lost:
            await self._post("Warning", "Lost", f"{me} lost shard(s) {_ranges(lost)}")
        if fenced:
            await self._post("Warning", "SelfFenced",
                             f"{me} closed shard(s) {_ranges(fenced)} at their deadline")
        if failed:
            await self._post("Warning", "RenewFailed", f"{me}: {failed[-1].error}")
        if unclosed:
            await self._post("Warning", "LeftToExpire",
                             f"{me} could not close shard(s) {_ranges(unclosed)}: their "
                             "leases are left to expire, not freed, since the application "
                             "may still have them open")
        if newer:
            await self._post("Warning", "NewerFormat",
                             f"{me} leaves shard(s) {_ranges(newer)} alone: their lease records "
                             "are of a format newer than this version knows")

    async def _post(self, type_: str, reason: str, message: str) -> None:
        body = self.body
        if body is None or self._api is None:
            logger.info("not posting %s (%s): %s", reason, message,
                        "no ShardSet seen yet" if body is None else "no API client")
            return
        meta = body.get("metadata") or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{self.shardset}.{uuid.uuid4().hex[:12]}",
                         "namespace": self.namespace},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
                               "name": self.shardset, "namespace": self.namespace,
                               "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "shardlease-agent", "host": self.pod_name},
            "reportingComponent": "shardlease.io/agent", "reportingInstance": self.pod_name,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            code, answer = await self._api.call("POST",
                                      f"/api/v1/namespaces/{self.namespace}/events", event)
            if code >= 300:
                logger.warning("could not post the %s event: %s %s", reason, code,
                               answer.get("message", ""))
        except Exception as e:
            logger.warning("could not post the %s event: %s", reason, e)

    # -- HTTP: health, metrics, lookup, drain -------------------------------------

    async def _serve(self) -> None:
        app = web.Application()
        app.add_routes([
            web.get("/healthz", self._healthz),
            web.get("/readyz", self._readyz),
            web.get("/metrics", self._metrics),
            web.get("/lookup", self._lookup),
            web.get("/owners", self._owners),
            web.get("/drain", self._drain),
            web.post("/drain", self._drain),
        ])
        self._web = web.AppRunner(app, access_log=None)
        await self._web.setup()
        await web.TCPSite(self._web, "0.0.0.0", self.port).start()

    def alive(self) -> tuple[bool, str]:
        """Liveness: the supervisor runs, or ended because it was asked to."""
        if self.died is not None:
            return False, str(self.died)
        sup = self._supervisor
        if sup is None:
            return False, "not started"
        if sup.done() and not self._stopping.is_set():
            return False, "the supervisor ended unexpectedly"
        return True, "ok"

    async def _healthz(self, _: web.Request) -> web.Response:
        alive, why = self.alive()
        return web.Response(status=200 if alive else 500, text=f"{why}\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        ready = self.loop is not None and self.loop.ready.is_set() \
            and not self._stopping.is_set() and self.died is None and self._resume is None
        return web.Response(status=200 if ready else 503, text="ready\n" if ready else "no\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _owner_json(self, shard: int) -> dict[str, Any]:
        loop = self.loop
        owners = {o.shard: o for o in loop.owners()} if loop else {}
        found = owners.get(shard)
        owner = loop.lookup(shard) if loop else None
        address = None
        if owner is not None:
            address = self.peers.address(owner)
        return {"shard": shard, "owner": owner, "address": address,
                "generation": found.generation if found and owner else None}

    async def _lookup(self, request: web.Request) -> web.Response:
        spec = self.spec
        if spec is None or self.loop is None:
            return web.json_response({"error": "not ready"}, status=503)
        q = request.query
        try:
            if "key" in q:
                shard = shard_for_key(q["key"], spec.shards)
            elif "shard" in q:
                shard = int(q["shard"])
            else:
                raise ValueError("give ?shard=N or ?key=K")
            if not 0 <= shard < spec.shards:
                raise ValueError(f"shard must be in 0..{spec.shards - 1}")
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(self._owner_json(shard))

    async def _hold(self, spec: ShardSetSpec, why: str) -> tuple[Hold, asyncio.Task[Any] | None]:
        """How long this pod's shards are kept for its name as it stops, and
        why (shardlease.k8s.hold): told in the log and in an Event (the task
        posting it, which the stop need not wait for), so that a shard that
        moved in a held restart says why it did."""
        read = None
        if hold.needs_replicas(spec.handoff, self.pod_name):
            path = (f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets/"
                    f"{spec.stateful_set}")
            began = self._stop_began if self._stop_began is not None else time.monotonic()
            budget = hold.read_budget(self.own_pod, dt.datetime.now(dt.UTC),
                                      time.monotonic() - began)
            logger.info("handoff hold: reading the StatefulSet's replicas within %gs "
                        "(%g%% of %s)", budget.seconds, 100 * hold.GRACE_SHARE, budget.why)
            read = await hold.read_replicas(lambda: self.api.call("GET", path),
                                            budget=budget.seconds)
        decided = hold.decide(spec.handoff, spec.hold_seconds, self.pod_name, read)
        if spec.handoff == "hold":
            kept = (f"its shards are kept for its name for {decided.seconds:g}s"
                    if decided.seconds else "its shards are freed for the other pods")
            message = f"{self.pod_name} {why}: {kept}: {decided.why}"
            (logger.warning if decided.unknown else logger.info)("handoff hold: %s", message)
            return decided, self._spawn(self._post(
                "Warning" if decided.unknown else "Normal",
                "HandoffHold" if decided.seconds else "HandoffMove", message), "hold-event")
        return decided, None

    async def _owners(self, _: web.Request) -> web.Response:
        spec = self.spec
        if spec is None or self.loop is None:
            return web.json_response({"error": "not ready"}, status=503)
        return web.json_response({"shards": [self._owner_json(s) for s in range(spec.shards)]})

    async def _own_pod_now(self) -> dict[str, Any] | None:
        """This pod read from the API server (a drain must not trust a watch
        that may lag the deletion), else the watch's copy."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}"
        try:
            code, body = await self.api.call("GET", path)
            if code == 200:
                return body
            logger.warning("drain: cannot read pod %s: %s %s", self.pod_name, code,
                           body.get("message", ""))
        except Exception as e:
            logger.warning("drain: cannot read pod %s: %s", self.pod_name, e)
        return self.own_pod

    async def _kubelet_stops(self, pod: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The Events that announce a container stop in this pod (the
        kubelet's `Killing`); none when the API server cannot say."""
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        selector = f"involvedObject.name={self.pod_name},reason={KILLING}"
        if uid:
            selector += f",involvedObject.uid={uid}"
        try:
            code, body = await self.api.call(
                "GET", f"/api/v1/namespaces/{self.namespace}/events",
                query=[("fieldSelector", selector)], request_timeout=5.0)
        except Exception as e:
            logger.warning("drain: cannot list this pod's events: %s", e)
            return []
        if code != 200:
            logger.warning("drain: cannot list this pod's events: %s %s", code,
                           body.get("message", ""))
            return []
        return [e for e in body.get("items") or [] if isinstance(e, dict)]

    async def _look(self) -> tuple[str, str, dict[str, Any] | None]:
        """What a drain comes to (k8s/drain.py's verdict), looking again every
        0.25 s while it is a refusal, until `_look_until`. One look at a time:
        every drain request waits on the one in progress, which each request
        extends to its own start + `announce_wait`. So a flood of requests
        costs the API server what one look costs (a GET of the pod and a LIST
        of its events each 0.25 s), and a genuine request that joins a look
        begun by another still gets its own full wait for the kubelet's word."""
        clock = asyncio.get_running_loop()
        try:
            while True:
                pod = await self._own_pod_now()
                kind, why = verdict(pod, await self._kubelet_stops(pod), self.port)
                if kind != "refuse" or clock.time() >= self._look_until:
                    return kind, why, pod
                await asyncio.sleep(0.25)
        finally:
            self._looking = None

    async def _drain(self, request: web.Request) -> web.Response:
        """The request is not trusted (anyone on the pod network can send it):
        what it comes to is decided by the API server's view (k8s/drain.py)."""
        asked = time.monotonic()
        if self._stopping.is_set():
            await self.shutdown()
            return web.Response(text="drained\n")
        self._look_until = max(self._look_until,
                               asyncio.get_running_loop().time() + self.announce_wait)
        if self._looking is None:
            self._looking = asyncio.ensure_future(self._look())
        # (Shielded: a request whose client went away must not cancel the
        # look that others wait on.)
        kind, why, pod = await asyncio.shield(self._looking)
        if kind == "final":
            logger.info("drain from %s: %s: handing every shard off", request.remote, why)
            await self.shutdown(asked)
            return web.Response(text="drained\n")
        if kind == "pause":
            logger.info("drain from %s: %s: handing the shards off until it is back",
                        request.remote, why)
            ttl = self.spec.lease_ttl if self.spec is not None else 15.0
            await self.pause(restart_counts(pod, AGENT), resume_after=max(30.0, 2 * ttl),
                             asked=asked)
            return web.Response(text="paused: the shards are handed off until the application "
                                     "restarts\n")
        logger.warning("drain from %s refused: %s", request.remote, why)
        return web.Response(status=403, text=f"drain refused: {why}\n")


def spec_changes(old: ShardSetSpec, new: ShardSetSpec) -> list[str]:
    """What changed between two specs, in the ShardSet's own field names
    ("leaseTTL 15.0 -> 30.0"), leaving out the selector and the StatefulSet's
    name (nothing the loop uses)."""
    def flat(spec: ShardSetSpec) -> dict[str, Any]:
        body = spec.model_dump(by_alias=True)
        host = body.pop("host")
        body.pop("selector")
        body.pop("statefulSet")
        return {**body, **{f"host.{k}": v for k, v in host.items()}}

    before, after = flat(old), flat(new)
    return [f"{k} {before[k]} -> {after[k]}" for k in before if before[k] != after[k]]


def _ranges(shards: list[int]) -> str:
    """[1,2,3,7] -> '1-3,7'."""
    out: list[str] = []
    start = prev = None
    for s in shards:
        if start is None:
            start = prev = s
        elif s == prev + 1:  # type: ignore[operator]
            prev = s
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = s
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)

