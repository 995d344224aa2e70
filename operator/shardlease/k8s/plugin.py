"""`kubectl shardlease`: who owns what, from the cluster the kubeconfig names.

Installed as the console script `kubectl-shardlease`, so kubectl finds it on
PATH as a plugin:

    kubectl shardlease owners NAME [-n NS] [-o table|json]
    kubectl shardlease lookup NAME KEY [-n NS]
    kubectl shardlease describe NAME [-n NS]

Everything shown comes from the ShardSet's status (what the agents published),
the StatefulSet's pods (where an owner can be reached) and the ShardSet's
Events (the moves). An owner that is not among the live pods is marked `*`:
lookups never route to it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from shardlease.errors import PluginError as PluginError  # (re-exported: its old home)
from shardlease.errors import ShardleaseError
from shardlease.k8s.rollouts import Rollout
from shardlease.kubeapi import KubeClient
from shardlease.owners import OwnerRow, owners_table
from shardlease.routing import shard_for_key

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


NOT_LIVE = ("* not a live pod of the StatefulSet: lookups do not route to it, and its "
            "shards are taken over once their leases expire")


def _epoch(stamp: str | None) -> float:
    try:
        return dt.datetime.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=dt.UTC).timestamp()
    except ValueError:
        return 0.0


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def ago(stamp: str | None, now: dt.datetime) -> str:
    if not stamp:
        return "-"
    try:
        t = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return stamp
    s = int((now - t).total_seconds())
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


class View:
    """One read of a ShardSet and what goes with it."""

    def __init__(self, api: KubeClient, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.shardset: dict[str, Any] = {}
        self.pods: dict[str, dict[str, Any]] = {}

    async def load(self, with_pods: bool = True) -> View:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}"
        code, body = await self.api.call("GET", path)
        if code == 404:
            raise PluginError(f'shardset "{self.name}" not found in namespace '
                              f'"{self.namespace}"')
        if code != 200:
            raise PluginError(f"cannot read shardset {self.name}: {code} "
                              f"{body.get('message', '')}")
        self.shardset = body
        selector = (body.get("spec") or {}).get("selector") or {}
        if with_pods and selector:
            labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            code, pods = await self.api.call("GET", f"/api/v1/namespaces/{self.namespace}/pods",
                                    query=[("labelSelector", labels)])
            if code == 200:
                self.pods = {p["metadata"]["name"]: p for p in pods.get("items") or []}
        return self

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.shardset.get("status") or {})

    @property
    def shards(self) -> int:
        return int((self.shardset.get("spec") or {}).get("shards") or 0)

    def live(self) -> set[str]:
        return set(self.status.get("nodes") or [])

    def rows(self) -> list[dict[str, Any]]:
        owners = self.status.get("owners") or {}
        generations = self.status.get("generations") or {}
        since = self.status.get("since") or {}
        live = self.live()
        return [{"shard": s, "owner": owners.get(str(s)),
                 "generation": generations.get(str(s)),
                 "since": since.get(str(s)),
                 "live": owners.get(str(s)) in live} for s in range(self.shards)]


async def owners(view: View, output: str) -> str:
    rows = view.rows()
    if output == "json":
        return json.dumps({"namespace": view.namespace, "shardset": view.name,
                           "observedTime": view.status.get("observedTime"),
                           "shards": rows})
    now = dt.datetime.now(dt.UTC)
    # The same table as `shardlease owners`, with "not live" judged by the
    # agents (the status's live nodes) instead of a heartbeat record.
    table_rows = [OwnerRow(r["shard"], r["owner"], int(r["generation"] or 0),
                           _epoch(r["since"]), None if r["owner"] is None else r["live"])
                  for r in rows]
    return (owners_table(table_rows, now.timestamp(), mark_note=NOT_LIVE)
            + f"\n\npublished by {view.status.get('publishedBy', '-')}, "
            f"{ago(view.status.get('observedTime'), now)} ago")


async def lookup(view: View, key: str) -> str:
    if view.shards < 1:
        raise PluginError(f"shardset {view.name} has no shards")
    shard = shard_for_key(key, view.shards)
    row = view.rows()[shard]
    pod = view.pods.get(row["owner"] or "")
    address = ((pod or {}).get("status") or {}).get("podIP")
    if row["owner"] is None or not row["live"]:
        why = "no owner" if row["owner"] is None else f"owner {row['owner']} is not live"
        return f"key {key!r} -> shard {shard}: {why} (retry after the next rebalance)"
    return (f"key {key!r} -> shard {shard} -> {row['owner']} ({address or 'no address'}), "
            f"generation {row['generation']}")


async def describe(view: View) -> str:
    now = dt.datetime.now(dt.UTC)
    spec = view.shardset.get("spec") or {}
    status = view.status
    counts = Counter(r["owner"] for r in view.rows() if r["owner"])
    lines = [f"Name:         {view.name}", f"Namespace:    {view.namespace}",
             f"StatefulSet:  {spec.get('statefulSet')}", f"Shards:       {view.shards}",
             f"Store:        {spec.get('store')}",
             f"Lease TTL:    {spec.get('leaseTTL')}s",
             f"Published:    by {status.get('publishedBy', '-')}, "
             f"{ago(status.get('observedTime'), now)} ago", "", "Live pods:"]
    live = sorted(view.live() | set(counts))
    rows = []
    for pod in live:
        ip = ((view.pods.get(pod) or {}).get("status") or {}).get("podIP") or "-"
        rows.append((pod, str(counts.get(pod, 0)), ip,
                     "yes" if pod in view.live() else "NO"))
    lines.append(table(("POD", "SHARDS", "IP", "LIVE"), rows) if rows else "  (none)")
    reserved = status.get("reserved") or {}
    if reserved or spec.get("handoff") == "hold":
        lines += ["", f"Handoff:      hold, {spec.get('holdSeconds', 30)}s "
                  "(a replaced pod's shards are kept for it)", "Reserved:"]
        by_pod: dict[str, list[int]] = {}
        for shard, pod in reserved.items():
            by_pod.setdefault(str(pod), []).append(int(shard))
        lines.append(table(("POD", "SHARDS KEPT FOR IT"),
                           [(pod, " ".join(map(str, sorted(shards))))
                            for pod, shards in sorted(by_pod.items())])
                     if by_pod else "  (none)")
    rollout = Rollout.parse(status.get("lastRollout"))
    if rollout is not None:
        when = (f"done {ago(rollout.finished_at, now)} ago" if rollout.finished_at
                else "going on")
        lines += ["", f"Last rollout: to {rollout.revision}, started "
                  f"{ago(rollout.started_at, now)} ago, {when}: {rollout.moves} move(s)"]
    lines += ["", "Conditions:"]
    conds = [(c.get("type", ""), c.get("status", ""), c.get("reason", ""),
              ago(c.get("lastTransitionTime"), now), c.get("message", ""))
             for c in status.get("conditions") or []]
    lines.append(table(("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"), conds)
                 if conds else "  (none)")
    code, events = await view.api.call("GET", f"/api/v1/namespaces/{view.namespace}/events",
                              query=[("fieldSelector", f"involvedObject.name={view.name}")])
    items = sorted(events.get("items") or [] if code == 200 else [],
                   key=lambda e: e.get("lastTimestamp") or "")[-15:]
    lines += ["", "Moves (recent events):"]
    lines.append(table(("AGE", "TYPE", "REASON", "MESSAGE"),
                       [(ago(e.get("lastTimestamp"), now), e.get("type", ""),
                         e.get("reason", ""), e.get("message", "")) for e in items])
                 if items else "  (none)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl shardlease",
                                description="Who owns which shard of a ShardSet.")
    p.add_argument("-n", "--namespace", help="default: the kubeconfig's namespace")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context")
    sub = p.add_subparsers(dest="command", required=True)
    o = sub.add_parser("owners", help="the owner and generation of every shard")
    o.add_argument("name")
    o.add_argument("-o", "--output", choices=("table", "json"), default="table")
    lk = sub.add_parser("lookup", help="which pod and generation a key goes to")
    lk.add_argument("name")
    lk.add_argument("key")
    d = sub.add_parser("describe", help="live pods, shares, conditions, recent moves")
    d.add_argument("name")
    for s in (o, lk, d):  # kubectl users put -n anywhere
        s.add_argument("-n", "--namespace", dest="sub_namespace", default=None,
                       help=argparse.SUPPRESS)
    return p


async def run(args: argparse.Namespace) -> str:
    api = KubeClient.from_config(args.kubeconfig, args.context)
    namespace = args.sub_namespace or args.namespace or api.namespace or "default"
    try:
        view = await View(api, namespace, args.name).load(with_pods=args.command != "owners")
        if args.command == "owners":
            return await owners(view, args.output)
        if args.command == "lookup":
            return await lookup(view, args.key)
        return await describe(view)
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        print(asyncio.run(run(args)))
    except ShardleaseError as e:
        print(f"kubectl shardlease: {e}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print(f"kubectl shardlease: cannot reach the cluster: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
