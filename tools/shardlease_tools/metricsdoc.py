"""docs/metrics.md, made from the registries the processes serve.

    python -m shardlease_tools.metricsdoc           # (re)writes docs/metrics.md
    python -m shardlease_tools.metricsdoc --check   # exit 1, with a diff, if it is stale

The registries are the ones the code builds (`shardlease.k8s.agent.agent_metrics`,
`shardlease.cli.node_metrics`, `shardlease.k8s.operator_http.OperatorMetrics`),
so a metric added to any of them is in the page once it is regenerated, and
tests/test_metrics_doc.py fails until it is. A label needs a line in
`LABELS`: the page says what every label means.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
COMMAND = "python -m shardlease_tools.metricsdoc"

#: Every label of every metric, and what its values are.
LABELS = {
    "cluster": "the ShardSet's name (an agent), or `shardlease node --cluster`",
    "node": "the pod's name (an agent), or `shardlease node --name`: not a Kubernetes node",
    "role": "`peer`: this node ended a peer's epoch and takes over its leases; `own`: a peer "
            "ended this node's epoch and this node fenced its shards",
    "result": "`shardlease_operator_reconciles`: `ok` or `error`; "
              "`shardlease_operator_injections`: `injected` or `skipped`",
    "generation": "the garbage collector's generation, 0 to 2",
    "implementation": "`python_info`: the interpreter (CPython)",
    "major": "`python_info`: Python's major version",
    "minor": "`python_info`: Python's minor version",
    "patchlevel": "`python_info`: Python's patch level",
    "version": "`python_info`: Python's full version",
}

#: What on-call needs beside a metric's HELP text (optional, per metric).
NOTES = {
    "shardlease_held_shards": "Set each round. Summed over a ShardSet's agents: its owned "
                              "shards as each pod last counted them (a dead pod's stays until "
                              "its series goes stale).",
    "shardlease_live_nodes": "Set each round: the nodes this pod counts as live for the fair "
                             "share.",
    "shardlease_self_fenced_shards": "Each fence is also a `SelfFenced` Event and a "
                                     "`self_fence` log record.",
    "shardlease_close_overruns": "The application's generation check is then the last guard.",
    "shardlease_epochs_ended": "Node renewal only (docs/renewal.md).",
    "shardlease_operator_stale_statuses": "No agent published the status for a while: the "
                                          "owners it shows may be gone.",
}


@dataclass(frozen=True)
class Metric:
    #: As a query names it: a counter with `_total`, a histogram without suffix.
    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    served_by: tuple[str, ...]


def registries() -> dict[str, CollectorRegistry]:
    """The registry each process serves, built by the code that serves it."""
    from shardlease.cli import node_metrics
    from shardlease.k8s.agent import agent_metrics
    from shardlease.k8s.operator_http import OperatorMetrics
    from shardlease.telemetry import Telemetry

    return {"agent": agent_metrics(Telemetry()), "`shardlease node`": node_metrics(Telemetry()),
            "operator": OperatorMetrics().registry}


def _collectors(registry: CollectorRegistry) -> list[Collector]:
    # prometheus-client has no public way to list a registry's collectors,
    # nor a labelled metric's label names before it has a child: the private
    # attributes are read here only, and a test fails if they go away.
    return list(registry._collector_to_names)


def _described(collector: Collector) -> Iterable[tuple[str, str, tuple[str, ...], str]]:
    """(name as queried, type, label names, help) of each family."""
    if isinstance(collector, MetricWrapperBase):
        (family,) = collector.describe()
        labels: tuple[str, ...] = tuple(collector._labelnames)
        yield _queried(family.name, family.type), family.type, labels, family.documentation
        return
    # The standard collectors (process, platform, gc) have samples at once.
    for family in collector.collect():
        names = {k for sample in family.samples for k in sample.labels} - {"le", "quantile"}
        yield (_queried(family.name, family.type), family.type, tuple(sorted(names)),
               family.documentation)


def _queried(family: str, kind: str) -> str:
    return f"{family}_total" if kind == "counter" else \
        f"{family}_info" if kind == "info" else family


def metrics(served: dict[str, CollectorRegistry] | None = None) -> list[Metric]:
    served = registries() if served is None else served
    seen: dict[str, Metric] = {}
    for server, registry in served.items():
        for collector in _collectors(registry):
            for name, kind, labels, text in _described(collector):
                known = seen.get(name)
                if known is not None and (known.type, known.labels, known.help) != \
                        (kind, labels, text):
                    raise ValueError(f"{name} differs between {known.served_by} and {server}")
                by = (*known.served_by, server) if known else (server,)
                seen[name] = Metric(name, kind, labels, text, by)
    missing = sorted({label for m in seen.values() for label in m.labels} - set(LABELS))
    if missing:
        raise ValueError(f"labels with no meaning in LABELS: {missing}")
    stale = sorted(set(NOTES) - {m.name.removesuffix("_total") for m in seen.values()})
    if stale:
        raise ValueError(f"NOTES of metrics that do not exist: {stale}")
    return sorted(seen.values(), key=lambda m: m.name)


HEADER = f"""# Metrics

<!-- Generated by `{COMMAND}` from the registries
the agent, `shardlease node` and the operator serve; tests/test_metrics_doc.py
fails when this page and the code disagree. Edit the code (or the tool's
LABELS and NOTES), then run the command: not this page. -->

> **Note: these names will change.** The `cluster` and `node` labels collide
> with labels that multi-cluster Prometheus setups (Thanos, Mimir) and a
> PodMonitor's targets add, and `node` is a pod's name, not a Kubernetes
> node's. Issue 43 plans one label for the ShardSet, `shardset`, and no
> `cluster`, `node`, `pod` or `namespace` of shardlease's own (those come
> from the scrape), with new metrics for on-call. That rename is a breaking
> change: it ships in the release the CHANGELOG names. Until then every
> metric and label here keeps its name.

Where they are served: the agent on `/metrics` of port 8470 (the container
port `shardlease`, which the chart's `metrics.podMonitor` scrapes); the
operator on `/metrics` of port 8080 (the Service port `http`, which
`metrics.serviceMonitor` scrapes); `shardlease node --metrics-port PORT` on
127.0.0.1.

A counter is queried with its `_total` suffix, as listed; a histogram as
`NAME_bucket`, `NAME_sum` and `NAME_count`. Each counter and histogram also
has a `NAME_created` series (when it was created, in seconds since 1970:
prometheus-client's default). A metric with labels has no series until its
first event.
"""


def _row(m: Metric) -> str:
    labels = ", ".join(f"`{label}`" for label in m.labels) or "none"
    meaning = m.help.rstrip(".") + "."
    note = NOTES.get(m.name.removesuffix("_total"))
    if note:
        meaning += f" {note}"
    return f"| `{m.name}` | {m.type} | {labels} | {', '.join(m.served_by)} | {meaning} |"


def render(found: list[Metric] | None = None) -> str:
    found = metrics() if found is None else found
    ours = [m for m in found if m.name.startswith("shardlease_")]
    runtime = [m for m in found if not m.name.startswith("shardlease_")]
    head = "| metric | type | labels | served by | meaning |\n| --- | --- | --- | --- | --- |"
    used = sorted({label for m in found for label in m.labels},
                  key=lambda label: (label not in ("cluster", "node"), label))
    return "\n".join([
        HEADER,
        "## shardlease's own",
        "",
        head,
        *(_row(m) for m in ours),
        "",
        "## The process and the Python runtime",
        "",
        "prometheus-client's standard collectors (their HELP text as they give it).",
        "",
        head,
        *(_row(m) for m in runtime),
        "",
        "## Labels",
        "",
        "| label | meaning |",
        "| --- | --- |",
        *(f"| `{label}` | {LABELS[label]} |" for label in used),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 with a diff if docs/metrics.md is stale")
    args = parser.parse_args(argv)
    text = render()
    current = DOC.read_text() if DOC.exists() else ""
    if args.check:
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(keepends=True), text.splitlines(keepends=True),
            "docs/metrics.md", f"docs/metrics.md as `{COMMAND}` writes it"))
        return 1
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
