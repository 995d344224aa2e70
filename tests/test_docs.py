"""The docs say what the code does: the README's annotation table (every
annotation the code knows and nothing else, each default the one a
StatefulSet without it gets), its ShardSet fields (every field of the CRD)
and helm values (every value of the chart, each default the chart's),
examples/README.md's host protocol (the one shardlease.hosts.http speaks),
docs/benchmarks.md's benchmark block (every section `shardlease bench`
prints, in both renewal modes), docs/operations.md's runbooks (every Event
reason and condition the operator and the agent write), and every
`shardlease` or `kubectl shardlease` command the README and docs/ show (a
subcommand and options that exist). Links between the docs resolve, one
release namespace is used, and the README stays short and starts with the
two commands CI runs."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml

import shardlease.hosts.http
from shardlease.k8s.spec import DEFAULT_HOST_URL, KNOWN, MAX_SHARDS, spec_from_annotations
from shardlease.records import MAX_HOLD

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCHMARKS = DOCS / "benchmarks.md"
OPERATIONS = DOCS / "operations.md"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
CHART = ROOT / "charts" / "shardlease"


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


def test_the_benchmark_block_has_every_section_the_bench_prints() -> None:
    sections = bench_sections()
    assert len(sections) >= 7, sections  # the pattern still finds them
    block = BENCHMARKS.read_text().split("## Benchmark", 1)[1].split("```", 2)[1]
    missing = [s for s in sections if s not in block]
    assert not missing, f"docs/benchmarks.md's benchmark block predates these sections: {missing}"
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


# -- the README's shape -------------------------------------------------------------------

TWO_COMMANDS = """```sh
scripts/demo     # set up and run the local demo (nodes on the embedded file store)
scripts/test     # set up and run the whole test suite (builds and starts every server it needs)
```"""


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 310, "the README grew: move the detail into docs/"
    assert text.split("```", 1)[0].count("\n") < 12  # the commands come first
    assert "```" + text.split("```", 2)[1] + "```" == TWO_COMMANDS
    # CI runs exactly the README's test command.
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "exec scripts/test"
    assert "## Quickstart on kind" in text


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), ROOT / "CHANGELOG.md"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_every_link_between_the_docs_resolves() -> None:
    broken, checked = [], 0
    for doc in doc_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https://, mailto:
            checked += 1
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert checked >= 40, checked  # (the pattern still reads the links)
    assert broken == []


def test_one_release_namespace_everywhere() -> None:
    # The one e2e/kind.sh and the real-pod scenario install into.
    assert 'RELEASE_NS=shardlease\n' in (ROOT / "e2e" / "kind.sh").read_text()
    for doc in [*doc_files(), CHART / "templates" / "NOTES.txt"]:
        text = doc.read_text()
        assert "shardlease-system" not in text, doc.name
        for ns in re.findall(r"helm (?:install|upgrade|uninstall) shardlease\b[^\n`]*?"
                             r"(?:-n|--namespace)[ =]([\w-]+)", text):
            assert ns == "shardlease", (doc.name, ns)


# -- the configuration reference ------------------------------------------------------------


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table under `heading`."""
    section = text.split(heading + "\n", 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    start = section.splitlines().index(lines[0])
    rows = []
    for line in section.splitlines()[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def crd_fields() -> set[str]:
    crd = yaml.safe_load((ROOT / "crds" / "shardlease.io_shardsets.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    out: set[str] = set()

    def walk(node: dict[str, object], prefix: str) -> None:
        for name, sub in (node.get("properties") or {}).items():  # type: ignore[attr-defined]
            if sub.get("properties"):
                walk(sub, f"{prefix}{name}.")
            else:
                out.add(prefix + name)
    walk(spec, "")
    return out


def test_the_readme_names_every_shardset_field_and_no_other() -> None:
    fields = crd_fields()
    assert {"shards", "store", "host.url", "holdSeconds"} <= fields, fields
    named = set()
    for row in _table(README.read_text(), "### ShardSet fields"):
        # The field names, not the annotations in brackets after them.
        named |= set(re.findall(r"`([A-Za-z.]+)`", re.sub(r"\([^)]*\)", "", row[0])))
    assert named == fields
    # The CRD in the chart is the same file.
    assert (CHART / "crds" / "shardlease.io_shardsets.yaml").read_text() == \
        (ROOT / "crds" / "shardlease.io_shardsets.yaml").read_text()


# Values that are Kubernetes objects handed to the pod spec as they are:
# documented as a whole, not key by key.
OPAQUE = {"resources", "agent.resources", "podSecurityContext", "securityContext",
          "livenessProbe", "readinessProbe"}


def chart_values() -> dict[str, object]:
    """Every value of the chart's values.yaml by its dotted path (a map is
    one value when empty or a Kubernetes object in OPAQUE)."""
    out: dict[str, object] = {}

    def walk(node: dict[str, object], prefix: str) -> None:
        for key, value in node.items():
            path = prefix + key
            if isinstance(value, dict) and value and path not in OPAQUE:
                walk(value, path + ".")
            else:
                out[path] = value
    walk(yaml.safe_load((CHART / "values.yaml").read_text()), "")
    return out


def _shown(value: object) -> str:
    """A default as the table writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def test_the_readme_documents_every_helm_value_with_the_charts_default() -> None:
    values = chart_values()
    assert OPAQUE <= set(values), OPAQUE - set(values)
    assert len(values) >= 50, len(values)  # (the walk still reads the file)
    documented: dict[str, str] = {}
    for row in _table(README.read_text(), "### Helm values"):
        names = re.findall(r"`([\w.]+)`", row[0])
        defaults = [d.strip() for d in row[1].split(",")] if len(names) > 1 else [row[1]]
        for i, name in enumerate(names):
            documented[name] = defaults[i] if len(defaults) == len(names) else row[1]
    assert sorted(set(values) - set(documented)) == [], "values.yaml values the README lacks"
    assert sorted(set(documented) - set(values)) == [], "README values values.yaml lacks"
    wrong = {name: (documented[name], _shown(v)) for name, v in values.items()
             if name not in OPAQUE and documented[name].strip("`") != _shown(v)}
    assert wrong == {}, "README default != values.yaml's: {name: (README, chart)}"


# -- the runbooks ----------------------------------------------------------------------------


def _k8s_source() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "operator" / "shardlease" / "k8s")
                                                   .glob("*.py")))


def event_reasons() -> set[str]:
    """Every Event reason the operator (kopf.warn/info) and the agent (_post) write."""
    src = _k8s_source()
    reasons = set(re.findall(r'_post\(\s*"(?:Normal|Warning)",\s*"(\w+)"', src))
    reasons |= set(re.findall(r'kopf\.(?:warn|info)\(.{0,120}?reason="(\w+)"', src, re.S))
    reasons |= set(re.findall(r'"(Handoff\w+)"', src))  # the hold's, chosen by a conditional
    return reasons


def conditions() -> tuple[set[str], set[str]]:
    """(types, reasons) of every condition the operator and the agents set."""
    src = _k8s_source()
    status = (ROOT / "operator" / "shardlease" / "k8s" / "status.py").read_text()
    types = {"Configured"}  # _set_condition's default
    types |= set(re.findall(r'type_="(\w+)"', src))
    types |= set(re.findall(r'\{"type": "(\w+)", "status"', status))
    reasons = set(re.findall(r'_set_condition\(\s*[^"]*?"(?:True|False|Unknown)",\s*"(\w+)"',
                             src, re.S))
    reasons |= set(re.findall(r'\(\s*"(?:True|False|Unknown)",\s*"(\w+)"', src))
    return types, reasons


def test_the_runbooks_cover_every_event_the_code_writes_and_no_other() -> None:
    reasons = event_reasons()
    assert {"InvalidAnnotation", "SelfFenced", "HandoffMove", "LoopDied"} <= reasons, reasons
    rows = _table(OPERATIONS.read_text(), "## Runbooks: Events")
    documented = {r[0].strip("`") for r in rows}
    assert documented == reasons
    assert all(r[-1] for r in rows), "a runbook row without what to do"


def test_the_runbooks_cover_every_condition_and_reason() -> None:
    types, reasons = conditions()
    assert {"Configured", "Ready", "Balanced", "Degraded", "AgentsCurrent"} <= types, types
    assert {"StatusStale", "FairShares", "AllShardsOwned", "AnnotationsValid"} <= reasons
    rows = _table(OPERATIONS.read_text(), "## Runbooks: conditions")
    assert {r[0].strip("`") for r in rows} == types
    named = {n for r in rows for n in re.findall(r"`(\w+)`", r[1])}
    assert sorted(reasons - named) == []


def test_troubleshooting_names_only_events_and_conditions_that_exist() -> None:
    types, reasons = conditions()
    known = types | reasons | event_reasons() | {"Killing"}  # the kubelet's, read by the drain
    rows = [r for heading in ("## Install and injection", "## Placement",
                              "## Upgrades and isolation")
            for r in _table(TROUBLESHOOTING.read_text(), heading)]
    assert len(rows) >= 15, len(rows)
    named = {n for r in rows for n in re.findall(r"`([A-Z]\w+)(?:=\w+)?`", r[1])}
    assert named and named <= known, named - known
    # Every Warning the code writes has a row of its own somewhere in the doc.
    text = TROUBLESHOOTING.read_text()
    missing = [r for r in event_reasons() | reasons if f"`{r}`" not in text
               and r not in {"ShardSetApplied", "Claimed", "Released", "Reconfigured",
                             "HandoffHold", "AnnotationsValid", "AllPodsInjected",
                             "AgentsCurrent", "AccountLabelled", "FairShares",
                             "AllShardsOwned", "Ready"}]
    assert missing == [], "troubleshooting.md lacks these"


# -- the commands shown --------------------------------------------------------------------


def _spans(text: str) -> list[str]:
    """Shell text shown: each line of a ```sh or ``` block, and each `code span`."""
    out = []
    for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.DOTALL):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if i and lines[i - 1].rstrip().endswith("\\"):
                continue  # part of the line before
            j, joined = i, line
            while joined.rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                joined = joined.rstrip()[:-1] + " " + lines[j]
            out.append(joined)
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    out += [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose)]
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def shown_commands() -> list[tuple[str, str, list[str]]]:
    """(doc, program, words) of every `shardlease ...` and `kubectl shardlease
    ...` command shown, from the program's name to a comment or a pipe."""
    found = []
    for doc in doc_files():
        for span in _spans(doc.read_text()):
            for part in re.split(r"\||&&|;|\$\(|#", span):
                words = part.split()
                while words and re.fullmatch(r"\w+=\S*", words[0]):
                    words = words[1:]  # VAR=value before the command
                if words[:2] == ["kubectl", "shardlease"]:
                    found.append((doc.name, "kubectl shardlease", words[2:]))
                elif words[:1] == ["shardlease"] and len(words) > 1:
                    found.append((doc.name, "shardlease", words[1:]))
    return found


def test_every_command_shown_exists_with_its_options() -> None:
    from shardlease.cli import build_parser
    from shardlease.k8s.plugin import parser as plugin_parser

    programs = {"shardlease": build_parser(), "kubectl shardlease": plugin_parser()}
    shown = shown_commands()
    assert len(shown) >= 30, shown  # (the pattern still reads the docs)
    assert {w[0] for _, p, w in shown if p == "kubectl shardlease" and w} >= {
        "owners", "lookup", "describe"}
    wrong = []
    for doc, program, words in shown:
        top = programs[program]
        options = _options(top)
        while words and words[0].startswith("-"):  # options before the subcommand
            if words[0].split("=")[0] not in options:
                wrong.append(f"{doc}: {program} {words[0]}")
            words = words[2:] if "=" not in words[0] else words[1:]
        if not words:
            continue
        sub = _subparsers(top).get(words[0])
        if sub is None:
            wrong.append(f"{doc}: {program} {words[0]} (no such subcommand)")
            continue
        allowed = options | _options(sub)
        for word in words[1:]:
            if word.startswith("-") and word != "-" and not re.fullmatch(r"-\d.*", word):
                if word.split("=")[0] not in allowed:
                    wrong.append(f"{doc}: {program} {words[0]} {word}")
    assert wrong == []
