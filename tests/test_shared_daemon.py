"""e2e/cluster.py's shared_daemon, which the Docker engine goes through: a
daemon several processes use at once is stopped by the last of them to
leave, never under another (the suite's two pytest processes both use the
engine), never when somebody else started it, and not kept up for a user
that died without leaving.

The daemon here is a `sleep` (what is shared is the bookkeeping, not
Docker); its users are real processes, each with the module loaded on its
own, as the suite's groups have it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: A user of the daemon: enters, says so on stdout, leaves when its stdin closes.
USER = textwrap.dedent("""
    import os, subprocess, sys
    sys.path.insert(0, {e2e!r})
    import cluster

    pidfile = cluster.cp.cache_dir() / "sleeper.pid"

    def running():
        try:
            return cluster.cp._alive(int(pidfile.read_text()))
        except (OSError, ValueError):
            system = os.environ.get("SYSTEM_SLEEPER")
            return bool(system) and cluster.cp._alive(int(system))

    def start():
        return subprocess.Popen(["sleep", "600"], start_new_session=True).pid

    with cluster.shared_daemon("sleeper", running, start,
                               lambda pid: cluster.cp._terminate(pid, "sleep")):
        print("in", flush=True)
        sys.stdin.read()
""")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("SHARDLEASE_CACHE", str(tmp_path))
    yield tmp_path
    pidfile = tmp_path / "sleeper.pid"
    if pidfile.exists():  # a failed test leaves no sleeper behind
        try:
            os.kill(int(pidfile.read_text()), 9)
        except (OSError, ValueError):
            pass


def user(**env: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", USER.format(e2e=str(ROOT / "e2e"))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **env})
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "in", "the user never entered"
    return p


def leave(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    assert p.wait(timeout=60) == 0


def sleeper(cache: Path) -> int:
    return int((cache / "sleeper.pid").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_first_user_to_leave_does_not_stop_it_under_the_other(cache: Path) -> None:
    first = user()
    pid = sleeper(cache)
    second = user()
    assert sleeper(cache) == pid  # the running one, not a second
    leave(first)  # it started the daemon
    assert alive(pid), "the daemon was stopped under its other user"
    leave(second)
    assert gone(pid), "the last user left and the daemon still runs"
    assert not (cache / "sleeper.pid").exists()


def test_a_user_that_died_is_not_waited_for(cache: Path) -> None:
    first = user()
    pid = sleeper(cache)
    second = user()
    second.kill()
    second.wait()
    leave(first)
    assert gone(pid), "a dead user kept the daemon up"


def test_a_daemon_somebody_else_started_is_never_stopped(cache: Path) -> None:
    system = subprocess.Popen(["sleep", "600"])
    try:
        leave(user(SYSTEM_SLEEPER=str(system.pid)))
        assert alive(system.pid), "a daemon this code did not start was stopped"
        assert not (cache / "sleeper.pid").exists()  # and none was started
    finally:
        system.kill()
        system.wait()


def test_after_the_last_user_left_the_next_one_starts_it_again(cache: Path) -> None:
    first = user()
    pid = sleeper(cache)
    leave(first)
    assert gone(pid)
    again = user()
    assert sleeper(cache) != pid and alive(sleeper(cache))
    leave(again)
