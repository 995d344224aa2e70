"""The docs say what the code does: the README's annotation table (every
annotation the code knows and nothing else, each default the one a
StatefulSet without it gets), examples/README.md's host protocol (the one
shardlease.hosts.http speaks), and the README's benchmark block (every
section `shardlease bench` prints, in both renewal modes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import shardlease.hosts.http
from shardlease.k8s.spec import DEFAULT_HOST_URL, KNOWN, MAX_SHARDS, spec_from_annotations
from shardlease.records import MAX_HOLD

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def annotation_table() -> dict[str, tuple[str, str]]:
    """annotation (without the prefix) -> (default, meaning), as the README says."""
    text = README.read_text()
    table = text.split("### Annotations", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, tuple[str, str]] = {}
    for line in table.splitlines()[2:]:
        names, default, meaning = (c.strip() for c in line.strip("|").split("|", 2))
        for name in re.findall(r"`(?:shardlease\.io/)?([a-z-]+)`", names):
            rows[name] = (default, meaning)
    return rows


def defaults() -> dict[str, object]:
    sts = {"metadata": {"name": "db", "namespace": "ns",
                        "annotations": {"shardlease.io/shards": "4"}},
           "spec": {"selector": {"matchLabels": {"app": "db"}}}}
    spec = spec_from_annotations(sts)
    assert spec is not None
    options = spec.options(name="db-0", cluster="db")
    ttl = options.lease_ttl
    return {
        "store": spec.store.replace("//ns", "//<namespace>"),
        "lease-ttl": f"{ttl:g}",
        "interval": "lease-ttl/3" if options.interval_s == ttl / 3 else options.interval_s,
        "margin": "lease-ttl/6" if options.margin_s == ttl / 6 else options.margin_s,
        "max-concurrency": str(options.max_concurrency),
        "max-moves-per-round": "no cap" if options.max_moves_per_round is None
        else str(options.max_moves_per_round),
        "renewal": options.renewal,
        "handoff": spec.handoff,
        "hold-seconds": f"{spec.hold_seconds:g}",
        "host-url": spec.host.url or DEFAULT_HOST_URL,
    }


def test_every_annotation_the_code_knows_is_in_the_table_and_no_other() -> None:
    assert set(annotation_table()) == KNOWN


@pytest.mark.parametrize("name", sorted(defaults()))
def test_the_tables_default_is_the_codes(name: str) -> None:
    default = annotation_table()[name][0].strip("`")
    assert default == defaults()[name], f"README says {default!r} for shardlease.io/{name}"


def test_the_tables_limits_are_the_codes() -> None:
    rows = annotation_table()
    assert f"1 to {MAX_SHARDS}" in rows["shards"][1]
    assert f"at most {MAX_HOLD:g}" in rows["hold-seconds"][1]


def _calls(text: str) -> list[str]:
    """The protocol's lines (`POST ...` and their continuations), spaces collapsed."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip().startswith("POST {base}/"):
            call = line.strip()
            for more in lines[i + 1:]:
                if not more.strip() or more.strip().startswith("POST"):
                    break
                call += " " + more.strip()
            out.append(" ".join(call.split()))
    return out


def test_the_examples_readme_shows_the_host_protocol_the_agent_speaks() -> None:
    spoken = _calls(shardlease.hosts.http.__doc__ or "")
    assert len(spoken) == 4, spoken  # open, close, lease, abort
    assert _calls((ROOT / "examples" / "README.md").read_text()) == spoken


def bench_sections() -> list[str]:
    """Each section `shardlease bench` prints, by the literal start of its
    `== ... ==` header in bench.py (up to the first placeholder or bracket)."""
    source = (ROOT / "tools" / "shardlease_tools" / "bench.py").read_text()
    heads = re.findall(r'say\(f?"(== [^"{(]+)', source)
    return sorted({h.strip() for h in heads})


def test_the_readmes_benchmark_block_has_every_section_the_bench_prints() -> None:
    sections = bench_sections()
    assert len(sections) >= 7, sections  # the pattern still finds them
    block = README.read_text().split("## Benchmark", 1)[1].split("```", 2)[1]
    missing = [s for s in sections if s not in block]
    assert not missing, f"README's benchmark block predates these sections: {missing}"
    # Both renewal modes are measured (docs/renewal.md), and the block says so.
    assert "shard renewal" in block and "node renewal" in block


def test_every_test_docs_renewal_md_names_is_there() -> None:
    # Each rule names the test that checks it: a name that a rename or a
    # removal left behind would be a rule checked by nothing.
    text = (ROOT / "docs" / "renewal.md").read_text()
    named = set(re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text))
    assert len({n for n in named if n[1]}) >= 20, named  # (the pattern still reads the doc)
    missing = []
    for path, name in sorted(named):
        source = ROOT / path
        if not source.is_file():
            missing.append(path)
        elif name and not re.search(rf"^\s*(async )?def {name}\(|^class {name}\b",
                                    source.read_text(), re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert missing == [], f"docs/renewal.md names what is not there: {missing}"
