"""docs/metrics.md lists every metric the agent, `shardlease node` and the
operator serve, with its type, labels and meaning, and nothing else (#43
item 1's reference): it is the page `python -m shardlease_tools.metricsdoc`
makes from their registries, and that tool's view of a registry is the one
its /metrics exposition shows."""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shardlease.cli import node_metrics
from shardlease.k8s.agent import agent_metrics
from shardlease.k8s.operator_http import OperatorMetrics
from shardlease.telemetry import Event, Telemetry
from shardlease_tools import metricsdoc

TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
DUMMY = {"str": "x", "int": 1, "float": 0.5, "bool": False, "tuple[int, ...]": (1,)}


def test_the_page_is_the_one_the_registries_make() -> None:
    page = metricsdoc.DOC.read_text()
    made = metricsdoc.render()
    if page != made:
        diff = "".join(difflib.unified_diff(page.splitlines(keepends=True),
                                            made.splitlines(keepends=True),
                                            "docs/metrics.md", "as the registries make it"))
        pytest.fail(f"docs/metrics.md is stale: run `{metricsdoc.COMMAND}`\n{diff}",
                    pytrace=False)


def every_event() -> list[Event]:
    """One event of each kind, of any values (only the metrics' names and
    label names are looked at)."""
    kinds: list[type[Event]] = []
    pending = list(Event.__subclasses__())
    while pending:
        kind = pending.pop()
        kinds.append(kind)
        pending += kind.__subclasses__()
    return [kind(**{f.name: DUMMY[str(f.type)] for f in dataclasses.fields(kind)})
            for kind in kinds]


def test_what_each_process_exposes_is_what_the_page_says() -> None:
    telemetries = {"agent": Telemetry(), "`shardlease node`": Telemetry()}
    operator = OperatorMetrics()
    served = {"agent": agent_metrics(telemetries["agent"]),
              "`shardlease node`": node_metrics(telemetries["`shardlease node`"]),
              "operator": operator.registry}
    # Every labelled metric gets a series: one event of each kind, and the
    # operator's own counters.
    for telemetry in telemetries.values():
        for event in every_event():
            telemetry.emit(event)
    operator.reconciles.labels("ok").inc()
    operator.injections.labels("injected").inc()
    listed = {m.name: m for m in metricsdoc.metrics(served)}
    assert listed == {m.name: m for m in metricsdoc.metrics()}  # what the page was made from

    for server, registry in served.items():
        text = generate_latest(registry).decode()
        # Families, from the exposition's TYPE lines (a counter's and a
        # histogram's `_created` series is the page's general note).
        typed = {name: kind for name, kind in TYPE_LINE.findall(text)
                 if not (name.endswith("_created") and kind == "gauge")}
        mine = {n: m.type for n, m in listed.items() if server in m.served_by}
        assert typed == mine, f"{server}: exposed {typed}, the page says {mine}"
        # Label names, from the samples.
        labels: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = next(n for n in mine if sample.name in (
                    n, f"{n}_bucket", f"{n}_sum", f"{n}_count",
                    f"{n.removesuffix('_total')}_created", f"{n}_created"))
                labels.setdefault(name, set()).update(set(sample.labels) - {"le"})
        for name in mine:
            assert labels.get(name, set()) == set(listed[name].labels), \
                f"{server}: {name} has labels {labels.get(name)}, the page says " \
                f"{listed[name].labels}"


def test_a_metric_the_page_lacks_or_an_unexplained_label_fails() -> None:
    extra = CollectorRegistry()
    Counter("shardlease_frobs", "Frobs", ["cluster"], registry=extra)
    found = metricsdoc.metrics({**metricsdoc.registries(), "agent2": extra})
    assert "| `shardlease_frobs_total` | counter | `cluster` | agent2 | Frobs. |" in \
        metricsdoc.render(found).splitlines()
    assert metricsdoc.render(found) != metricsdoc.DOC.read_text()
    Counter("shardlease_zones", "Zones", ["zone"], registry=extra)
    with pytest.raises(ValueError, match=r"labels with no meaning in LABELS: \['zone'\]"):
        metricsdoc.metrics({"agent": extra})


def test_the_check_passes_on_the_page_and_shows_a_stale_ones_diff(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert metricsdoc.main(["--check"]) == 0
    stale = tmp_path / "metrics.md"
    stale.write_text(metricsdoc.DOC.read_text().replace("shardlease_claims_total", "gone"))
    monkeypatch.setattr(metricsdoc, "DOC", stale)
    assert metricsdoc.main(["--check"]) == 1
    assert "+| `shardlease_claims_total` |" in capsys.readouterr().out
    assert metricsdoc.main([]) == 0
    assert stale.read_text() == metricsdoc.render()
