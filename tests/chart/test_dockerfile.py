"""The Dockerfile and .dockerignore, read and checked as text.

There is no Docker engine where these tests run, so `docker build` itself
cannot run here: these tests parse the Dockerfile and check its shape
(multi-stage, non-root, the package installed from a built wheel, no source
in the final image, the `shardlease` entrypoint). Build it on a machine with
Docker: `docker build -t shardlease:0.1.0 .`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

import pytest

from .conftest import ROOT


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int

    @property
    def flags(self) -> dict[str, str]:
        """--name=value flags at the start of the arguments (COPY --from=...)."""
        out = {}
        for word in shlex.split(self.args):
            if not word.startswith("--"):
                break
            name, _, value = word[2:].partition("=")
            out[name] = value
        return out

    @property
    def operands(self) -> list[str]:
        if self.args.lstrip().startswith("["):
            return json.loads(self.args)
        return [w for w in shlex.split(self.args) if not w.startswith("--")]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Dockerfile -> (global ARG defaults, stages). Handles comments, line
    continuations and ${ARG} in FROM."""
    instructions: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)),
                          words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may precede FROM"
            key, _, value = ins.args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse((ROOT / "Dockerfile").read_text())[1]


def test_parser_understands_continuations_and_stages():
    _, st = parse("ARG B=img:1\n# c\nFROM ${B} AS b\nRUN a \\\n  # note\n  && b\nFROM b\n"
                  'ENTRYPOINT ["x"]\n')
    assert [(s.base, s.name) for s in st] == [("img:1", "b"), ("b", None)]
    assert st[0].instructions[0].args.split() == ["a", "&&", "b"]
    assert st[1].all("ENTRYPOINT")[0].operands == ["x"]


def test_multi_stage_on_python_3_11_slim(stages):
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert builder.name == "builder"
    assert builder.base == "python:3.11-slim"
    assert final.base == "python:3.11-slim"


def test_builder_builds_a_wheel_and_installs_it_into_a_venv(stages):
    run = " ".join(i.args for i in stages[0].all("RUN"))
    assert "python -m venv /opt/shardlease" in run
    assert "pip wheel" in run and "--no-deps" in run
    assert re.search(r"/opt/shardlease/bin/pip install /wheels/shardlease-\S*\.whl", run), run


def test_final_stage_runs_as_non_root(stages):
    users = stages[-1].all("USER")
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0")
    assert user == "65532"  # the uid the chart's securityContext expects


def test_final_stage_copies_only_the_venv_from_the_builder(stages):
    final = stages[-1]
    copies = final.all("COPY") + final.all("ADD")
    assert copies
    for c in copies:
        assert c.keyword == "COPY", f"line {c.line}: ADD in the final stage"
        assert c.flags.get("from") == "builder", (
            f"line {c.line}: the final stage copies from the build context: {c.args}")
        assert c.operands == ["/opt/shardlease", "/opt/shardlease"], c.args
    # and certainly not the whole source tree
    for c in copies:
        assert not re.match(r"^(--\S+\s+)*\.\s", c.args), f"line {c.line}: COPY . in final"


def test_entrypoint_is_shardlease(stages):
    final = stages[-1]
    (entry,) = final.all("ENTRYPOINT")
    assert entry.args.startswith("["), "exec form, so signals reach shardlease"
    assert json.loads(entry.args) == ["shardlease"]
    assert json.loads(final.all("CMD")[-1].args) == ["--help"]
    env = " ".join(i.args for i in final.all("ENV"))
    assert "PATH=/opt/shardlease/bin:$PATH" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def test_builder_copies_only_what_the_build_needs(stages):
    sources = []
    for c in stages[0].all("COPY"):
        assert "from" not in c.flags
        sources += c.operands[:-1]
    assert sorted(sources) == ["README.md", "operator/", "pyproject.toml"]
    for s in sources:
        assert (ROOT / s).exists(), f"the Dockerfile copies {s}, which the repository lacks"


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `*` and `?` stop at `/`, `**`
    matches any number of directories (also none)."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(patterns: list[str], path: str) -> bool:
    """.dockerignore semantics: the last matching pattern wins; `!` re-includes;
    a pattern matching a directory matches everything under it."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern(pattern[1:] if negate else pattern)
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_the_package_to_the_build():
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for path in ("pyproject.toml", "README.md", "operator/shardlease/__init__.py",
                 "operator/shardlease/stores/kubernetes.py", "operator/shardlease/py.typed"):
        assert not _ignored(patterns, path), path
    for path in (".git/HEAD", ".venv/bin/python", "tests/chart/test_render.py",
                 "charts/shardlease/values.yaml", "e2e/controlplane.py", "Dockerfile",
                 "operator/shardlease/__pycache__/loop.cpython-311.pyc",
                 "operator/shardlease.egg-info/PKG-INFO", ".pytest_cache/v/x"):
        assert _ignored(patterns, path), path
