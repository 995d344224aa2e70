"""The explorer (`python -m shardlease.sim.explore`) and what it found.

- Regressions: every case in tests/sim/regressions.py holds every invariant.
- Check the checker: every patch in tests/sim/mutants/ puts a known bug back
  into a copy of the package; the explorer must catch it within the budget
  the patch names (a `# explore: ...` line above its first `diff --git`; or
  `--replay SEED ...`: that case, one the explorer found once, must break an
  invariant; or instead `# regression: NAME`, a case of regressions.py, for
  a bug no swarm case draws; or `# test: NODEID`, a test of the suite, for a
  bug whose judge is a table or a loop test because no simulated case
  decides it alone), and the same cases (the test) on the unpatched tree
  must be clean (the mutant, not some other violation, was caught). A patch may
  also say `# expect: (c)`: the violation caught must be one whose text
  starts so, and the unpatched tree must show none such in the same cases
  (others, of open bugs in the kinds the patch needs, it may).
- The explorer on the unpatched tree finds nothing in a fixed set of cases
  (leaving out the fault kinds of open bugs, regressions.PENDING_KINDS), and
  replays a case from its seed.
- The pending cases (open bugs) still fail: a fix must move them.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import shardlease
from shardlease.records import Renewal
from shardlease.sim import StoreFault, case_for
from tests.sim.regressions import PENDING, PENDING_KINDS, REGRESSIONS, Regression

PACKAGE = Path(shardlease.__file__).parent
MUTANTS = sorted((Path(__file__).parent / "mutants").glob("*.patch"))
#: The explorer's arguments for a patch without its own `# explore:` line.
DEFAULT_EXPLORE = ["--seconds", "60", "--seed", "1"]
#: Leaves out the fault kinds of open bugs (regressions.PENDING_KINDS).
SKIP_PENDING = ["--skip", ",".join(PENDING_KINDS)] if PENDING_KINDS else []


def explore(*args: str, pythonpath: Path | None = None,
            timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "shardlease.sim.explore", *args],
                          capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=pythonpath or PACKAGE.parent)


#: Runs one case of regressions.py (by name) and prints its violations as
#: `--replay` does (the package: the first entry of PYTHONPATH).
RUN_REGRESSION = """
import sys
from pathlib import Path
import shardlease
from tests.sim.regressions import PENDING, REGRESSIONS
print(f"running {Path(shardlease.__file__).parent}")
(case,) = [r.case for r in REGRESSIONS + PENDING if r.name == sys.argv[1]]
found = case.run().violations
print(f"violations ({len(found)}):")
print("".join(f"  {v}\\n" for v in found), end="")
sys.exit(1 if found else 0)
"""


def in_process(code: str, arg: str, pythonpath: Path | None) -> subprocess.CompletedProcess[str]:
    """`code` run with `arg` in a process of its own, on `pythonpath`'s
    package (the tree's if None)."""
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(pythonpath or PACKAGE.parent), str(root)])}
    return subprocess.run([sys.executable, "-c", code, arg], capture_output=True,
                          text=True, env=env, timeout=300.0, cwd=root)


def regression(name: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A case of regressions.py run in a process of its own."""
    return in_process(RUN_REGRESSION, name, pythonpath)


def runs(output: str) -> int:
    found = re.search(r"^runs (\d+) in ", output, re.MULTILINE)
    assert found, output
    return int(found.group(1))


@pytest.mark.parametrize("regression", REGRESSIONS, ids=lambda r: r.name)
def test_regression(regression: Regression) -> None:
    result = regression.case.run()
    assert result.violations == [], \
        f"{regression.note}\n{regression.case!r}\n" + "\n".join(result.violations)


def test_pending_cases_still_fail() -> None:
    # Fixed? Move the case from PENDING to REGRESSIONS (and its kinds out of
    # PENDING_KINDS once no pending case needs them).
    fixed = [r.name for r in PENDING if not r.case.run().violations]
    assert not fixed, f"{fixed} no longer break an invariant: move them to REGRESSIONS"


def test_pending_kinds_are_those_of_the_pending_cases() -> None:
    # A kind is left out of the swarm only while an open bug needs it left out.
    for r in PENDING:
        assert set(r.case.kinds) & set(PENDING_KINDS), r.name
    for kind in PENDING_KINDS:
        assert any(kind in r.case.kinds for r in PENDING), \
            f"{kind!r} is left out of the swarm but no pending case needs it"


def header(patch: Path, key: str) -> str | None:
    """The `# key: ...` line of a patch (before its first `diff --git`)."""
    for line in patch.read_text().splitlines():
        if line.startswith("diff --git"):
            break
        if line.startswith(f"# {key}:"):
            return line.removeprefix(f"# {key}:").strip()
    return None


def explore_args(patch: Path) -> list[str]:
    """The `# explore:` line of a patch."""
    found = header(patch, "explore")
    return shlex.split(found) if found is not None else list(DEFAULT_EXPLORE)


def violations(output: str, replayed: bool) -> list[str]:
    """The violations an explorer's output shows: each case's first (the
    explorer), or every one (a replay)."""
    if replayed:
        lines = output.split("\nviolations (", 1)[-1].splitlines()[1:]
        return [line.strip() for line in itertools.takewhile(
            lambda line: line.startswith("  "), lines)]
    return re.findall(r"^VIOLATION seed=\d+ renewal=\w+ kinds=\S*: (.*?)  \[", output,
                      re.MULTILINE)


def patched_copy(patch: Path, root: Path) -> Path:
    """A copy of the package with `patch` applied: the PYTHONPATH entry."""
    shutil.copytree(PACKAGE, root / "operator" / "shardlease",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # (No repository around the copy: git apply then patches files relative to cwd.)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent)}
    done = subprocess.run(["git", "apply", "-C1", str(patch)], cwd=root, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, \
        f"{patch.name} no longer applies to the tree; regenerate it:\n{done.stderr}"
    return root / "operator"


def test_mutants_are_there() -> None:
    assert MUTANTS, "tests/sim/mutants holds no patch"


#: Runs one pytest node id on the package first on PYTHONPATH, after saying
#: which package that is (`running ...`).
RUN_TEST = """
import sys
from pathlib import Path
import pytest
import shardlease
print(f"running {Path(shardlease.__file__).parent}", flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1]]))
"""


def unit_test(nodeid: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A test of the suite run in a process of its own."""
    return in_process(RUN_TEST, nodeid, pythonpath)


@pytest.mark.parametrize("patch", MUTANTS, ids=lambda p: p.stem)
def test_each_mutant_is_caught(patch: Path, tmp_path: Path) -> None:
    nodeid = header(patch, "test")
    if nodeid is not None:
        # A bug whose judge is a test of the suite, not a simulated case (no
        # swarm case decides it alone: see the patch): that test fails on
        # the patched copy, and passes on the tree.
        copy = patched_copy(patch, tmp_path / "tree")
        caught = unit_test(nodeid, pythonpath=copy)
        assert f"running {copy / 'shardlease'}" in caught.stdout, caught.stdout
        assert caught.returncode == 1 and " failed" in caught.stdout, \
            f"{nodeid} did not catch {patch.name}:\n{caught.stdout}\n{caught.stderr}"
        clean = unit_test(nodeid)
        assert clean.returncode == 0, f"{nodeid} fails on the tree:\n{clean.stdout}"
        return
    args = explore_args(patch)
    named = header(patch, "regression")
    replayed = "--replay" in args or named is not None
    expect = header(patch, "expect")
    if "--kinds" not in args and "--skip" not in args and not replayed:
        args += SKIP_PENDING  # (the unpatched tree must be clean in the same cases)
    copy = patched_copy(patch, tmp_path / "tree")
    if named is not None:
        what = f"the regression case {named}"
        caught = regression(named, pythonpath=copy)
        assert f"running {copy / 'shardlease'}" in caught.stdout, caught.stdout
    else:
        what = shlex.join(args)
        caught = explore(*args, *([] if replayed else ["--first"]), pythonpath=copy)
        if not replayed:
            assert f"exploring {copy / 'shardlease'}" in caught.stdout, caught.stdout
    found = violations(caught.stdout, replayed)
    assert caught.returncode == 1 and found, \
        f"the explorer did not catch {patch.name} ({what}):\n{caught.stdout}\n{caught.stderr}"
    if expect is not None:
        assert any(v.startswith(expect) for v in found), \
            f"{patch.name} was caught by no violation {expect}:\n{caught.stdout}"
    # The same cases on the unpatched tree: clean, so the mutant was caught.
    if named is not None:
        clean = regression(named)
    else:
        clean = explore(*args, *([] if replayed else ["--runs", str(runs(caught.stdout))]))
    if expect is None:
        assert clean.returncode == 0, \
            f"the unpatched tree breaks an invariant in the cases that caught {patch.name}:\n" \
            f"{clean.stdout}\n{clean.stderr}"
    else:  # (other violations there are open bugs of the kinds the mutant needs)
        assert clean.returncode in (0, 1) and not any(
            v.startswith(expect) for v in violations(clean.stdout, replayed)), \
            f"the unpatched tree shows a violation {expect} in the cases that caught " \
            f"{patch.name}:\n{clean.stdout}\n{clean.stderr}"


def test_the_explorer_finds_nothing_on_the_tree() -> None:
    done = explore("--seconds", "120", "--runs", "24", "--seed", "0", *SKIP_PENDING)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert runs(done.stdout) == 24
    assert re.search(r"\(\d+\.\d\d runs/s\)", done.stdout), done.stdout


def test_a_replay_prints_the_case_its_trace_and_no_violation() -> None:
    case = case_for(5, "shard")
    done = explore("--replay", "5", "--renewal", "shard", "--tail", "3")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.startswith(f"case 5: nodes={case.nodes} shards={case.shards}")
    assert "trace (the last 3 of " in done.stdout
    assert done.stdout.rstrip().endswith("violations (0):")


def test_a_seed_is_the_same_case_in_every_process() -> None:
    assert case_for(12345) == case_for(12345)
    assert case_for(12345).reproducer() == (
        f"python -m shardlease.sim.explore --replay 12345 --renewal {case_for(12345).renewal}")
    # Forcing the mode changes the mode, and which store calls a one-call
    # fault picks (swarm.GROUP_WEIGHTS are per mode); nothing else: the
    # same kinds, and the same faults at the same times.
    other: Renewal = "node" if case_for(12345).renewal == "shard" else "shard"
    forced, drawn = case_for(12345, other), case_for(12345)
    assert forced.kinds == drawn.kinds and forced.renewal == other
    assert [(type(f), f.at) for f in forced.faults] == [(type(f), f.at) for f in drawn.faults]
    assert [replace(f, calls=None) if isinstance(f, StoreFault) else f
            for f in forced.faults] == [replace(f, calls=None) if isinstance(f, StoreFault)
                                        else f for f in drawn.faults]
