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


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state first), or
    None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def started(pid: int) -> str | None:
    """When the process started (clock ticks since boot): with the pid, the
    process's identity, since a pid is used again once its process is gone."""
    fields = stat(pid)
    return fields[19] if fields else None


def alive(pid: int, since: str | None = None) -> bool:
    """Alive and not a zombie; and, given `since`, the process that started then."""
    fields = stat(pid)
    return fields is not None and fields[0] != "Z" and (since is None or fields[19] == since)


def gone(pid: int, since: str | None, timeout: float = 30) -> bool:
    """The process `pid` named when it started at `since` is gone within
    `timeout` (the pid used again by a process started later does not count)."""
    deadline = time.monotonic() + timeout
    while alive(pid, since):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def what(pid: int) -> str:
    """The process `pid` names, for an assertion's message."""
    fields = stat(pid)
    if fields is None:
        return f"no process {pid}"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmd = "?"
    return f"process {pid}: state {fields[0]}, parent {fields[1]}, started at tick {fields[19]}, " \
           f"command {cmd!r}"


def test_the_first_user_to_leave_does_not_stop_it_under_the_other(cache: Path) -> None:
    first = user()
    pid = sleeper(cache)
    since = started(pid)
    second = user()
    assert sleeper(cache) == pid  # the running one, not a second
    leave(first)  # it started the daemon
    assert alive(pid, since), "the daemon was stopped under its other user"
    leave(second)
    assert gone(pid, since), f"the last user left and the daemon still runs: {what(pid)}"
    assert not (cache / "sleeper.pid").exists()


def test_a_user_that_died_is_not_waited_for(cache: Path) -> None:
    first = user()
    pid = sleeper(cache)
    since = started(pid)
    second = user()
    second.kill()
    second.wait()
    leave(first)
    assert gone(pid, since), f"a dead user kept the daemon up: {what(pid)}"


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
    since = started(pid)
    leave(first)
    assert gone(pid, since), f"the last user left and the daemon still runs: {what(pid)}"
    again = user()
    assert (sleeper(cache), started(sleeper(cache))) != (pid, since)
    assert alive(sleeper(cache))
    leave(again)
