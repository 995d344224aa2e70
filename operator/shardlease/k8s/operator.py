"""The cluster operator (`shardlease operator`), on kopf.

Level-based and stateless: every event of a StatefulSet reconciles the
ShardSet its annotations ask for (create, update, or delete it). Only kopf's
event handlers and a mutating webhook are used, so kopf writes no state
annotations onto users' objects, and it runs standalone (kopf's peering cannot
fence a second operator, and one reconciler per object is all this needs).
kopf never retries an event handler, so a reconciliation that failed (an API
server that answered 5xx, a permission not yet granted) is retried here, with
backoff, from the newest body seen, until it succeeds or the object changes.

- opted in (`shardlease.io/shards`): a ShardSet of the same name, owned by the
  StatefulSet (garbage-collected with it), and a RoleBinding granting the
  pods' ServiceAccount the `shardlease-agent` ClusterRole in that namespace
  (never the `default` ServiceAccount unless the StatefulSet allows it by
  annotation: `Configured=False`, reason DefaultServiceAccount, instead);
- a malformed annotation: a Warning Event on the StatefulSet and the
  ShardSet's `Configured` condition set to False (the last good spec stays);
- annotation removed: the ShardSet and the RoleBinding are deleted;
- pods of opted-in StatefulSets get the agent sidecar (webhook, fails open);
  the webhook reads a StatefulSet it has not seen yet from the API server (a
  pod created right after its StatefulSet, as GitOps tools do), and Ready pods
  found without the agent are reported (`AgentsInjected=False` and an Event);
- a rollout of an opted-in StatefulSet: its moves counted in the ShardSet's
  `status.lastRollout` (shardlease.k8s.rollouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import re
from typing import Any, cast

import kopf

from shardlease.errors import ConfigError
from shardlease.k8s.discovery import pod_ready
from shardlease.k8s.inject import (
    AgentConfig,
    has_agent,
    inject,
    native_sidecars_supported,
    outdated_agents,
    owner_statefulset,
)
from shardlease.k8s.leader import LeaderElector
from shardlease.k8s.login import identity, register_login
from shardlease.k8s.operator_http import OperatorMetrics, ProbeServer
from shardlease.k8s.rollouts import Rollout, Tracking
from shardlease.k8s.rollouts import step as rollout_step
from shardlease.k8s.spec import (
    SHARDS,
    agent_config_from_annotations,
    default_account_allowed,
    drain_containers,
    inject_wanted,
    spec_from_annotations,
)
from shardlease.k8s.status import interval_of, merge_conditions, stale_for
from shardlease.kubeapi import KubeClient

logger = logging.getLogger("shardlease.operator")

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
AGENT_ROLE = "shardlease-agent"
RETRY_FIRST, RETRY_MAX = 2.0, 60.0
MANAGED = {"app.kubernetes.io/managed-by": "shardlease"}
#: On a ShardSet: the ServiceAccount its agents run as, the one the chart's
#: isolation policy (ValidatingAdmissionPolicy) lets write its Leases and
#: its status. Only the operator writes ShardSets' metadata: the agents may
#: patch the status subresource only, which cannot change a label.
SERVICE_ACCOUNT = "shardlease.io/service-account"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def shardset_labels(account: str) -> dict[str, str]:
    """A ShardSet's labels: managed by shardlease, and its agents' account
    (left out when the name does not fit a label value)."""
    if len(account) <= 63 and _LABEL_VALUE.match(account):
        return {**MANAGED, SERVICE_ACCOUNT: account}
    return dict(MANAGED)


class Operator:
    def __init__(self, *, agent_image: str, webhook: kopf.WebhookServer | None = None,
                 kubeconfig: str | None = None, namespaces: list[str] | None = None,
                 agent_config: AgentConfig | None = None,
                 http: tuple[str, int] | None = None,
                 leader_election: tuple[str, str] | None = None) -> None:
        self.agent_image = agent_image
        self.agent_config = agent_config or AgentConfig()
        #: Inject the agent as a native sidecar (decided at start from /version).
        self.native = False
        self.webhook = webhook
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces or []
        #: (namespace, statefulset) -> the pods last reported without the agent.
        self.missing: dict[tuple[str, str], tuple[str, ...]] = {}
        #: (namespace, statefulset) -> pod -> the older agent image it was last reported with.
        self.outdated: dict[tuple[str, str], dict[str, str]] = {}
        self.applied: dict[tuple[str, str], Any] = {}
        #: (namespace, statefulset) -> (newest body, delay, when to retry): failed reconciles.
        self.retries: dict[tuple[str, str], tuple[dict[str, Any], float, float]] = {}
        self._retry_wake = asyncio.Event()
        self._retrier: asyncio.Task[None] | None = None
        #: Every ShardSet as last seen, to mark statuses nobody refreshes.
        self.shardsets: dict[tuple[str, str], dict[str, Any]] = {}
        self._stale_watch: asyncio.Task[None] | None = None
        #: (namespace, name) -> the rollout being counted (while leading).
        self.rollouts: dict[tuple[str, str], Tracking] = {}
        self._rollout_lock = asyncio.Lock()
        self.metrics = OperatorMetrics()
        #: Set once every StatefulSet was listed: the webhook's answers are then
        #: complete (readiness waits for it).
        self.warm = asyncio.Event()
        self.http = http
        #: Every StatefulSet's newest body, opted in or not, from the first
        #: listing and the watch, kept by every replica: the webhook decides
        #: from it (and reads only those it has never seen), a deleted ShardSet
        #: is recreated from it, and a new leader reconciles them all.
        self.latest: dict[tuple[str, str], dict[str, Any]] = {}
        self.elector: LeaderElector | None = None
        if leader_election is not None:
            namespace, name = leader_election
            self.elector = LeaderElector(self.api, namespace=namespace, name=name,
                                         identity=identity())
        self._campaign: asyncio.Task[None] | None = None
        self._resync: asyncio.Task[None] | None = None
        self._probes: ProbeServer | None = None
        self._warmer: asyncio.Task[None] | None = None
        self._api: KubeClient | None = None
        self._lock = asyncio.Lock()
        self.registry = kopf.OperatorRegistry()
        self._register()

    async def api(self) -> KubeClient:
        async with self._lock:
            if self._api is None:
                self._api = KubeClient.from_config(self.kubeconfig)
            return self._api

    async def run(self) -> None:
        await kopf.operator(registry=self.registry, standalone=True,
                            clusterwide=not self.namespaces, namespaces=self.namespaces,
                            identity=identity())

    def _register(self) -> None:
        reg = self.registry

        @kopf.on.startup(registry=reg)
        async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.scanning.disabled = True
            settings.watching.server_timeout = 300
            if self.webhook is not None:
                settings.admission.server = self.webhook
            await self.detect_native_sidecars()
            self._warmer = asyncio.create_task(self.warm_cache(), name="shardlease-warm")
            if self.http is not None:
                webhook = (self.webhook.addr or "0.0.0.0", self.webhook.port or 0) \
                    if self.webhook is not None else None
                self._probes = ProbeServer(self.metrics, warm=self.warm, webhook=webhook,
                                           alive=self.problem)
                await self._probes.start(*self.http)

        register_login(reg, self.kubeconfig)

        @kopf.on.cleanup(registry=reg)
        async def cleanup(**_: Any) -> None:
            if self._probes is not None:
                await self._probes.stop()
            for task in (self._retrier, self._stale_watch, self._warmer, self._campaign,
                         self._resync):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self._api is not None:
                await self._api.close()

        @kopf.on.event("apps", "v1", "statefulsets", registry=reg)
        async def statefulset_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            await self.on_statefulset(type, dict(body))

        @kopf.on.event(GROUP, VERSION, PLURAL, registry=reg)
        async def shardset_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            meta = body.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if type == "DELETED":
                self.shardsets.pop(key, None)
                self.metrics.shardsets.set(len(self.shardsets))
            else:
                self.shardsets[key] = dict(body)
                self.metrics.shardsets.set(len(self.shardsets))
                if self.leading():
                    await self.update_ready(dict(body))
                    await self.count_rollout(key)
                if self._stale_watch is None:  # in kopf's context (see _retrier)
                    self._stale_watch = asyncio.create_task(self._mark_stale_statuses(),
                                                            name="shardlease-stale")
            if type == "DELETED":
                self.applied.pop(key, None)
                sts = self.opted_in(key)
                if sts is not None and self.leading():
                    logger.info("ShardSet %s/%s was deleted while opted in: recreating", *key)
                    await self.reconcile_or_retry(sts)

        if self.webhook is None:
            # kopf refuses to run admission handlers with no server to serve
            # them: without certificates the operator reconciles, nothing more.
            return

        @kopf.on.mutate("", "v1", "pods", operations={"CREATE"}, id="inject-agent", registry=reg)
        async def inject_agent(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
            injected = await self.injected(dict(body))
            if injected is not None:
                patch.fns.append(lambda b: _replace(b, injected))

    # -- health -------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the operator is not alive, or None: a background task of its own died."""
        for task in (self._retrier, self._stale_watch, self._warmer):
            if task is not None and task.done() and not task.cancelled() and task.exception():
                return f"{task.get_name()} died: {task.exception()!r}"
        return None

    async def warm_cache(self) -> None:
        """List every StatefulSet once, so the webhook decides from a full cache."""
        paths = [f"/apis/apps/v1/namespaces/{ns}/statefulsets" for ns in self.namespaces] \
            or ["/apis/apps/v1/statefulsets"]
        delay = RETRY_FIRST
        while True:
            try:
                items: list[dict[str, Any]] = []
                for path in paths:
                    code, body = await (await self.api()).call("GET", path)
                    if code != 200:
                        raise ConfigError(f"GET {path}: {code} {body.get('message', '')}")
                    items += body.get("items") or []
                break
            except Exception as e:
                logger.warning("cannot list StatefulSets (%s); retrying in %.0fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        for sts in items:
            meta = sts.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            self.latest.setdefault(key, sts)  # the watch may have shown a newer one
        self.warm.set()
        logger.info("cache warm: %d StatefulSet(s) seen", len(items))

    # -- injection ----------------------------------------------------------------

    async def detect_native_sidecars(self) -> None:
        try:
            code, version = await (await self.api()).call("GET", "/version")
        except Exception as e:
            code, version = 0, {"message": str(e)}
        if code != 200:
            logger.warning("cannot read the server version (%s %s): injecting the agent as "
                           "a regular container", code, version.get("message", ""))
            return
        self.native = native_sidecars_supported(str(version.get("major", "")),
                                                str(version.get("minor", "")))
        logger.info("Kubernetes %s: the agent is injected as a %s", version.get("gitVersion"),
                    "native sidecar (init container, restartPolicy Always)" if self.native
                    else "regular container")

    async def injected(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The pod with the agent, or None when it gets none."""
        name = owner_statefulset(pod)
        namespace = (pod.get("metadata") or {}).get("namespace")
        if name is None or not namespace:
            return None
        key = (namespace, name)
        sts = self.opted_in(key)
        if sts is None and key not in self.latest:
            # Created a moment ago: the watch has not shown it yet.
            sts = await self._read_statefulset(namespace, name)
        if sts is None or not inject_wanted(sts):
            return None
        try:
            if spec_from_annotations(sts) is None:
                return None
            config = agent_config_from_annotations(sts, self.agent_config)
            drained = drain_containers(sts)
        except ConfigError:
            return None  # reported on the StatefulSet by the reconciler
        native = self.native if config.native_sidecar is None else config.native_sidecar
        out = inject(pod, self.agent_image, name, native=native, config=config,
                     drain_containers=drained)
        self.metrics.injections.labels("injected" if out != pod else "skipped").inc()
        return None if out == pod else out

    async def _read_statefulset(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            code, body = await (await self.api()).call("GET",
                                    f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}")
        except Exception as e:
            logger.warning("webhook: cannot read StatefulSet %s/%s: %s", ns, name, e)
            return None
        if code != 200:
            if code != 404:
                logger.warning("webhook: cannot read StatefulSet %s/%s: %s %s", ns, name, code,
                               body.get("message", ""))
            return None
        return body

    # -- reconciliation -----------------------------------------------------------

    async def on_statefulset(self, event_type: str | None, sts: dict[str, Any]) -> None:
        meta = sts.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            # The ShardSet and RoleBinding are owned by it: the garbage
            # collector removes them.
            self.missing.pop(key, None)
            self.outdated.pop(key, None)
            self.applied.pop(key, None)
            self.retries.pop(key, None)
            self.latest.pop(key, None)
            return
        self.latest[key] = sts
        if self.leading() and key in self.shardsets:
            await self.count_rollout(key)
        if self.elector is not None and self._campaign is None:
            # From a resource handler: it inherits kopf's context (see _retrier).
            self._campaign = asyncio.create_task(self.elector.run(self._lead),
                                                 name="shardlease-leader")
        if self.leading():
            await self.reconcile_or_retry(sts)

    def opted_in(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The newest body of a StatefulSet that carries the opt-in annotation."""
        sts = self.latest.get(key)
        if sts is None or SHARDS not in ((sts.get("metadata") or {}).get("annotations") or {}):
            return None
        return sts

    def leading(self) -> bool:
        """Whether this replica reconciles (always, without leader election)."""
        return self.elector is None or self.elector.leading.is_set()

    async def _lead(self) -> None:
        """Just elected: reconcile everything (events seen as a follower were
        not), in a task of its own so that the Lease keeps being renewed."""
        async def resync() -> None:
            for sts in list(self.latest.values()):
                if not self.leading():
                    return
                await self.reconcile_or_retry(sts)
        self._resync = asyncio.create_task(resync(), name="shardlease-resync")

    async def reconcile_or_retry(self, sts: dict[str, Any], delay: float = RETRY_FIRST,
                                 retrying: bool = False) -> None:
        meta = sts.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        try:
            await self.reconcile(sts)
            self.metrics.reconciles.labels("ok").inc()
        except Exception as e:  # every failure is retried; none is lost
            self.metrics.reconciles.labels("error").inc()
            when = asyncio.get_running_loop().time() + delay
            self.retries[key] = (sts, delay, when)
            self._retry_wake.set()
            if self._retrier is None:
                # Started from a resource handler, so that it inherits kopf's
                # context: kopf.warn/info need the operator's event queue,
                # which startup handlers do not have yet.
                self._retrier = asyncio.create_task(self._retry_failed(),
                                                    name="shardlease-retry")
            logger.warning("StatefulSet %s/%s: reconciling failed (%s); retrying in %.0fs",
                           *key, e, delay)
        else:
            if self.retries.pop(key, None) is not None or retrying:
                logger.info("StatefulSet %s/%s: reconciled after retrying", *key)
        self.metrics.retries_pending.set(len(self.retries))

    async def _mark_stale_statuses(self, every: float = 5.0) -> None:
        """Balanced=Unknown on ShardSets whose agents stopped publishing."""
        while True:
            await asyncio.sleep(every)
            if not self.leading():
                continue
            now = dt.datetime.now(dt.UTC)
            for (ns, name), body in list(self.shardsets.items()):
                status = body.get("status") or {}
                age = stale_for(status, interval_of(body.get("spec") or {}), now)
                if age is None:
                    continue
                balanced: dict[str, Any] = next((c for c in status.get("conditions") or []
                                 if c.get("type") == "Balanced"), {})
                if balanced.get("status") == "Unknown":
                    continue
                msg = (f"no agent has published this status for {age:.0f}s (since "
                       f"{status.get('observedTime')}, by {status.get('publishedBy')}): "
                       "the owners shown may be gone")
                logger.warning("ShardSet %s/%s: %s", ns, name, msg)
                self.metrics.stale_statuses.inc()
                try:
                    await self._set_condition(ns, name, "Unknown", "StatusStale", msg,
                                              type_="Balanced")
                except Exception as e:
                    logger.warning("ShardSet %s/%s: cannot mark the status stale: %s",
                                   ns, name, e)

    async def count_rollout(self, key: tuple[str, str]) -> None:
        """The moves of the StatefulSet's rollout, into `status.lastRollout`
        (a failure to write is logged and written with the next change)."""
        # (The StatefulSet's and the ShardSet's handlers run concurrently.)
        async with self._rollout_lock:
            sts, shardset = self.latest.get(key), self.shardsets.get(key)
            if sts is None or shardset is None:
                return
            before = self.rollouts.get(key)
            tracking, record = rollout_step(
                before, sts, shardset,
                dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            if tracking is None:
                self.rollouts.pop(key, None)
            else:
                self.rollouts[key] = tracking
            if record is None:
                return
            if await self._write_rollout(*key, record):
                if tracking is not None:
                    tracking.wrote = record
            elif tracking is None:
                # A finished record not written: kept, so that the next event writes it.
                self.rollouts[key] = Tracking(record=record,
                                              wrote=before.wrote if before else None)

    async def _write_rollout(self, ns: str, name: str, record: Rollout) -> bool:
        try:
            code, answer = await self._call(
                "PATCH", self._shardset_path(ns, name) + "/status",
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
                 "metadata": {"name": name, "namespace": ns},
                 "status": {"lastRollout": record.wire()}},
                "application/apply-patch+yaml", allow=(404, 409, 422),
                query=[("fieldManager", "shardlease-operator-rollout"), ("force", "true")])
        except Exception as e:  # informational: the next event writes it again
            logger.warning("ShardSet %s/%s: cannot write the rollout's moves: %s", ns, name, e)
            return False
        if code >= 400:
            if code != 404:
                logger.warning("ShardSet %s/%s: cannot write the rollout's moves: %s %s", ns,
                               name, code, answer.get("message", ""))
            return False
        if record.finished_at is not None:
            logger.info("ShardSet %s/%s: rollout to %s done, %d move(s)", ns, name,
                        record.revision, record.moves)
        return True

    async def update_ready(self, shardset: dict[str, Any]) -> None:
        """Ready: configured, balanced, and no Ready pod without its agent; the
        one condition `kubectl wait --for=condition=Ready` needs."""
        meta = shardset.get("metadata") or {}
        conds = {c.get("type"): c for c in (shardset.get("status") or {}).get("conditions") or []}

        def status(type_: str) -> str | None:
            return (conds.get(type_) or {}).get("status")
        if status("Configured") != "True":
            want = ("False", "NotConfigured",
                    (conds.get("Configured") or {}).get("message") or "not configured yet")
        elif status("AgentsInjected") == "False":
            want = ("False", "AgentMissing", conds["AgentsInjected"].get("message", ""))
        elif status("Balanced") != "True":
            balanced = conds.get("Balanced") or {}
            want = ("Unknown" if status("Balanced") == "Unknown" else "False",
                    str(balanced.get("reason") or "NotBalanced"),
                    balanced.get("message") or "no agent has published the owners yet")
        else:
            want = ("True", "Ready", "configured, every Ready pod runs the agent, and the "
                    "shards are balanced")
        ready = conds.get("Ready") or {}
        if (ready.get("status"), ready.get("reason"), ready.get("message")) == want:
            return
        await self._set_condition(meta.get("namespace", ""), meta.get("name", ""), *want,
                                  type_="Ready")

    async def _retry_failed(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._retry_wake.clear()
            now = loop.time()
            for key, (sts, delay, when) in list(self.retries.items()):
                if not self.leading():
                    break
                if when <= now and self.retries.get(key, (None,))[0] is sts:
                    self.retries.pop(key)
                    await self.reconcile_or_retry(sts, min(delay * 2, RETRY_MAX), retrying=True)
            pending = [when for _, _, when in self.retries.values()]
            timeout = max(0.0, min(pending) - loop.time()) if pending else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._retry_wake.wait()

    async def reconcile(self, sts: dict[str, Any]) -> None:
        meta = sts.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        key = (ns, name)
        try:
            spec = spec_from_annotations(sts)
        except ConfigError as e:
            if self.applied.get(key) == ("invalid", str(e)):
                return
            logger.warning("StatefulSet %s/%s: %s", ns, name, e)
            kopf.warn(kopf.Body(cast(kopf.RawBody, sts)), reason="InvalidAnnotation",
                      message=str(e))
            await self._set_condition(ns, name, "False", "InvalidAnnotation", str(e))
            self.applied[key] = ("invalid", str(e))
            return
        if spec is None:
            if key in self.applied or await self._owned_shardset(ns, name, meta.get("uid")):
                await self._remove(ns, name, meta.get("uid"))
                self.applied.pop(key, None)
            return
        template = ((sts.get("spec") or {}).get("template") or {}).get("spec") or {}
        account = template.get("serviceAccountName") or "default"
        allowed = account != "default" or default_account_allowed(sts)
        desired = (spec.to_body(), account, allowed, meta.get("uid"))
        if self.applied.get(key) != desired:
            await self._apply_shardset(sts, spec.to_body(), account)
            if allowed:
                # (First: the agents wait on it; the conditions are for people.)
                await self._apply_rolebinding(sts, account)
                await self._set_condition(
                    ns, name, "True", "AnnotationsValid",
                    "the StatefulSet's shardlease.io annotations are valid")
            else:
                msg = ("the pods run as the namespace's `default` ServiceAccount: binding the "
                       "agent's role to it would give every pod using it access to the "
                       "leases. Give the StatefulSet a ServiceAccount of its own "
                       "(spec.template.spec.serviceAccountName), or annotate it "
                       "shardlease.io/allow-default-service-account=\"true\"")
                logger.warning("StatefulSet %s/%s: %s", ns, name, msg)
                kopf.warn(kopf.Body(cast(kopf.RawBody, sts)), reason="DefaultServiceAccount",
                          message=msg)
                await self._set_condition(ns, name, "False", "DefaultServiceAccount", msg)
            await self._report_account_label(sts, account)
            self.applied[key] = desired
            if allowed:
                kopf.info(kopf.Body(cast(kopf.RawBody, sts)), reason="ShardSetApplied",
                          message=f"ShardSet {name}: {spec.shards} shard(s) on {spec.store}")
        if inject_wanted(sts):
            await self._check_agents(sts)

    async def _report_account_label(self, sts: dict[str, Any], account: str) -> None:
        """Say on the ShardSet (condition `AccountLabelled`) whether it names
        its agents' ServiceAccount: the isolation policies match that label,
        and a name longer than a label value (63 characters; an account's may
        be 253) leaves the ShardSet's leases unprotected by them."""
        meta = sts["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if SERVICE_ACCOUNT in shardset_labels(account):
            await self._set_condition(
                ns, name, "True", "AccountLabelled",
                f"the ShardSet names its agents' ServiceAccount {account} (label "
                f"{SERVICE_ACCOUNT}), which the isolation policies match",
                type_="AccountLabelled")
            return
        msg = (f"the pods' ServiceAccount name {account!r} ({len(account)} characters) does "
               f"not fit a label value (at most 63 characters): the ShardSet cannot carry "
               f"the {SERVICE_ACCOUNT} label, so the isolation policies cannot protect its "
               "leases from other workloads of the namespace. Give the StatefulSet a "
               "ServiceAccount with a shorter name")
        logger.warning("ShardSet %s/%s: %s", ns, name, msg)
        kopf.warn(kopf.Body(cast(kopf.RawBody, sts)), reason="AccountNameTooLong", message=msg)
        await self._set_condition(ns, name, "False", "AccountNameTooLong", msg,
                                  type_="AccountLabelled")

    async def _check_agents(self, sts: dict[str, Any]) -> None:
        """Report Ready pods that run without the agent (created while the
        webhook was down: it fails open), so nobody wonders why they own nothing."""
        meta = sts["metadata"]
        ns, name = meta["namespace"], meta["name"]
        labels = ((sts.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not labels:
            return
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        code, pods = await self._call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector="
                                      f"{selector}")
        if code != 200:
            return
        mine = [p for p in pods.get("items") or [] if owner_statefulset(p) == name]
        key = (ns, name)
        await self._report_outdated(sts, key, outdated_agents(mine, self.agent_image))
        missing = tuple(sorted(
            p["metadata"]["name"] for p in mine if pod_ready(p) and not has_agent(p)))
        if self.missing.get(key) == missing:
            return
        if missing:
            msg = (f"Ready pod(s) without the shardlease agent: {', '.join(missing)} (created "
                   "while the webhook was unavailable?); delete them to get it injected")
            logger.warning("StatefulSet %s/%s: %s", ns, name, msg)
            kopf.warn(kopf.Body(cast(kopf.RawBody, sts)), reason="AgentMissing", message=msg)
            await self._set_condition(ns, name, "False", "AgentMissing", msg,
                                      type_="AgentsInjected")
        else:
            await self._set_condition(ns, name, "True", "AllPodsInjected",
                                      "every Ready pod runs the agent", type_="AgentsInjected")
        self.missing[key] = missing
        self.metrics.pods_without_agent.set(sum(len(m) for m in self.missing.values()))

    async def _report_outdated(self, sts: dict[str, Any], key: tuple[str, str],
                               outdated: dict[str, str]) -> None:
        """AgentsCurrent: False while pods run an agent older than the one
        injected now (the webhook injects at pod creation; an upgrade reaches
        a pod when it is recreated)."""
        if self.outdated.get(key) == outdated:
            return
        if outdated:
            pods = ", ".join(f"{pod} ({image})" for pod, image in outdated.items())
            msg = (f"pod(s) running another agent than {self.agent_image}: {pods}; they get "
                   "it when recreated (kubectl rollout restart)")
            kopf.info(kopf.Body(cast(kopf.RawBody, sts)), reason="AgentOutdated", message=msg)
            await self._set_condition(*key, "False", "AgentOutdated", msg, type_="AgentsCurrent")
        else:
            await self._set_condition(*key, "True", "AgentsCurrent",
                                      f"every pod with the agent runs {self.agent_image}",
                                      type_="AgentsCurrent")
        self.outdated[key] = outdated

    def _owner_ref(self, sts: dict[str, Any]) -> dict[str, Any]:
        # No blockOwnerDeletion: it would need update on statefulsets/finalizers
        # where OwnerReferencesPermissionEnforcement is on, and nothing here
        # needs the StatefulSet's deletion to wait for its ShardSet.
        meta = sts["metadata"]
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                "uid": meta["uid"], "controller": True}

    async def _call(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json",
                    allow: tuple[int, ...] = (404, 409),
                    query: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any]]:
        """One API call; statuses in `allow` are returned, other failures
        become kopf.TemporaryError (kopf logs them and the next event retries)."""
        status, payload = await (await self.api()).call(method, path, body, content_type,
                                     query=query)
        if status >= 400 and status not in allow:
            raise kopf.TemporaryError(
                f"{method} {path}: {status} {payload.get('message', '')}", delay=10)
        return status, payload

    def _shardset_path(self, ns: str, name: str | None = None) -> str:
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}"
        return base if name is None else f"{base}/{name}"

    async def _owned_shardset(self, ns: str, name: str, uid: str | None) -> bool:
        status, body = await self._call("GET", self._shardset_path(ns, name))
        if status != 200:
            return False
        refs = (body.get("metadata") or {}).get("ownerReferences") or []
        return any(r.get("uid") == uid for r in refs)

    async def _apply_shardset(self, sts: dict[str, Any], spec: dict[str, Any],
                              account: str) -> None:
        meta = sts["metadata"]
        ns, name = meta["namespace"], meta["name"]
        labels = shardset_labels(account)
        for _ in range(5):
            status, current = await self._call("GET", self._shardset_path(ns, name))
            if status == 404:
                body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
                        "metadata": {"name": name, "namespace": ns, "labels": labels,
                                     "ownerReferences": [self._owner_ref(sts)]},
                        "spec": spec}
                status, _ = await self._call("POST", self._shardset_path(ns), body)
                if status != 409:
                    logger.info("created ShardSet %s/%s", ns, name)
                    return
                continue
            cmeta = current.setdefault("metadata", {})
            old_labels = cmeta.get("labels") or {}
            # (Other labels are the user's; ours are set, a stale account label removed.)
            new_labels = {k: v for k, v in old_labels.items() if k != SERVICE_ACCOUNT} | labels
            if current.get("spec") == spec and old_labels == new_labels:
                return
            current["spec"], cmeta["labels"] = spec, new_labels
            status, _ = await self._call("PUT", self._shardset_path(ns, name), current)
            if status != 409:
                logger.info("updated ShardSet %s/%s", ns, name)
                return
        raise kopf.TemporaryError(f"ShardSet {ns}/{name} kept changing", delay=5)

    async def _apply_rolebinding(self, sts: dict[str, Any], account: str) -> None:
        meta = sts["metadata"]
        ns, name = meta["namespace"], meta["name"]
        rb_name = f"shardlease-agent-{name}"
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"
        body = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": rb_name, "namespace": ns, "labels": MANAGED,
                         "ownerReferences": [self._owner_ref(sts)]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": AGENT_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
        }
        status, current = await self._call("GET", f"{path}/{rb_name}")
        if status == 404:
            await self._call("POST", path, body)
        elif current.get("subjects") != body["subjects"]:
            # roleRef is immutable and always the same; only the subject moves.
            current["subjects"] = body["subjects"]
            await self._call("PUT", f"{path}/{rb_name}", current)

    async def _remove(self, ns: str, name: str, uid: str | None) -> None:
        if await self._owned_shardset(ns, name, uid):
            await self._call("DELETE", self._shardset_path(ns, name))
            logger.info("deleted ShardSet %s/%s: the StatefulSet opted out", ns, name)
        await self._call(
            "DELETE",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/"
            f"shardlease-agent-{name}")

    async def _set_condition(self, ns: str, name: str, status: str, reason: str,
                             message: str, type_: str = "Configured") -> None:
        """Set one condition (`Configured` by default) by server-side apply.

        Each condition type has a field manager of its own, so the API server
        keeps every other writer's conditions (the agents' Balanced and
        Degraded, this operator's other types) and no read-modify-write race
        can drop one. The read only keeps lastTransitionTime when the status
        did not change."""
        code, current = await self._call("GET", self._shardset_path(ns, name))
        if code != 200:
            return
        meta = current.get("metadata") or {}
        old = (current.get("status") or {}).get("conditions")
        cond = {"type": type_, "status": status, "reason": reason, "message": message}
        (merged,) = [c for c in merge_conditions([cond], old, meta.get("generation"))
                     if c["type"] == type_]
        code, answer = await self._call(
            "PATCH", self._shardset_path(ns, name) + "/status",
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
             "metadata": {"name": name, "namespace": ns},
             "status": {"conditions": [merged]}},
            "application/apply-patch+yaml", allow=(404, 409, 422),
            query=[("fieldManager", f"shardlease-operator-{type_.lower()}"),
                   ("force", "true")])
        if code >= 400 and code != 404:
            logger.warning("could not set the %s condition of %s/%s: %s %s", type_, ns, name,
                           code, answer.get("message", ""))


def _replace(body: kopf.RawBody, new: dict[str, Any]) -> None:
    # kopf applies our transformation to the raw body it diffs into a JSON patch.
    raw = cast(dict[str, Any], body)
    raw.clear()
    raw.update(new)


def default_agent_image() -> str:
    return os.environ.get("SHARDLEASE_AGENT_IMAGE", "shardlease:0.1.0")
