"""`shardlease verify`'s run mode as a user types it (docs/verify.md): node
and slatekv pairs on a MinIO it starts itself, eight clients, a fault
schedule drawn from the seed (kill -9 and restart, SIGSTOP past the TTL,
store latency through the fault proxy, a graceful leave, a join), the
history judged by porcupine and the checks beside it. Each seed's verdict
must be yes; and a mutant of the application (a write acknowledged before
it is durable) must be caught.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = Path(__file__).with_name("mutants")
KINDS = ("kill", "pause", "latency", "leave", "join")
VERDICT = re.compile(r"verify: seed (\d+), (\d+) ops, linearizable: (yes|no|unknown), "
                     r"lost acknowledged writes: (\S+), stale-generation writes: (\S+), "
                     r"double opens: (\S+)")


def verify(tmp_path: Path, *args: str, pythonpath: Path | None = None
           ) -> tuple[int, str, re.Match[str]]:
    """`shardlease verify ARGS --dir tmp_path/run`: (exit status, output, the
    last line's match)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "shardlease", "verify", *args,
                           "--dir", str(tmp_path / "run")], capture_output=True, text=True,
                          env=env, timeout=600, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    match = VERDICT.fullmatch(last)
    assert match is not None, f"no verdict as the last line:\n{out}"
    print(last)
    return proc.returncode, out, match


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "store"), [(1, "file"), (2, "s3")])
def test_verify_runs_the_slatedb_application_under_every_fault(
        tmp_path: Path, seed: int, store: str) -> None:
    code, out, verdict = verify(tmp_path, "--store", store, "--nodes", "3", "--shards", "6",
                                "--faults", ",".join(KINDS), "--seconds", "15",
                                "--seed", str(seed))
    for kind in KINDS:
        assert f"fault {kind}:" in out, (kind, out)
    assert verdict.group(1) == str(seed)
    assert int(verdict.group(2)) > 0
    assert verdict.groups()[2:] == ("yes", "0", "0", "0"), out
    assert code == 0, out
    for name in ("history.jsonl", "opens.jsonl", "node-n1.log", "app-n1.log"):
        assert (tmp_path / "run" / name).is_file(), name


@pytest.mark.slow
def test_verify_catches_a_write_acknowledged_before_it_is_durable(tmp_path: Path) -> None:
    """The mutant: slatefence's put answers without awaiting durability. A
    read that follows the acknowledgement misses the write (reads ask for
    durable data), and a kill -9 loses it: the verdict must fail."""
    copy = tmp_path / "examples"
    shutil.copytree(ROOT / "examples" / "shardlease_examples", copy / "shardlease_examples")
    patch = MUTANTS / "acknowledged-before-durable.patch"
    subprocess.run(["patch", "-p2", "-d", str(copy), "-i", str(patch)], check=True,
                   capture_output=True, timeout=60)
    assert "MUTANT" in (copy / "shardlease_examples" / "slatefence.py").read_text()
    code, out, verdict = verify(tmp_path, "--nodes", "2", "--shards", "4", "--faults", "kill",
                                "--seconds", "10", "--seed", "5", pythonpath=copy)
    assert code == 1, out
    assert verdict.group(3) != "yes" or verdict.group(4) != "0", out
