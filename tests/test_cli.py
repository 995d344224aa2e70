"""The command line's contract: errors, exit statuses and the owners output.

Run as a user would, in a child process (`python -m shardlease`), so that
exit statuses and stderr are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardlease.cli import parse_peers
from shardlease.errors import ConfigError
from shardlease.owners import OwnerRow, owners_table
from shardlease.records import Lease, new_write_id
from shardlease.stores.file import FileStore


def shardlease(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardlease", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def node_args(store: str, *extra: str) -> list[str]:
    return ["node", "--store", store, "--cluster", "c", "--name", "a", "--shards", "4", *extra]


def assert_config_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "error" in lines[0]
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(("extra", "words"), [
    (["--lease-ttl", "3", "--margin", "3"], ["margin", "lease_ttl"]),
    (["--lease-ttl", "3", "--margin", "5"], ["margin", "lease_ttl"]),
    (["--lease-ttl", "3", "--interval", "2.9"], ["interval"]),
    (["--max-concurrency", "0"], ["max_concurrency"]),
    (["--peer", "nobody"], ["--peer", "NAME=ADDRESS"]),
    (["--host", "carrier-pigeon"], ["--host"]),
    (["--lease-ttl", "soon"], ["--lease-ttl"]),
    (["--log-format", "xml"], ["--log-format"]),
])
def test_a_bad_node_option_is_one_clear_line_and_exit_2(tmp_path: Path, extra: list[str],
                                                        words: list[str]) -> None:
    assert_config_error(shardlease(*node_args(f"file://{tmp_path}", *extra)), *words)


def test_zero_shards_is_refused(tmp_path: Path) -> None:
    result = shardlease("node", "--store", f"file://{tmp_path}", "--cluster", "c",
                        "--name", "a", "--shards", "0")
    assert_config_error(result, "shards")


def test_an_unknown_store_scheme_is_refused_with_the_accepted_forms() -> None:
    result = shardlease(*node_args("ftp://somewhere/leases"))
    assert_config_error(result, "ftp://somewhere/leases", "file:///path", "s3://")


def test_a_malformed_file_store_url_is_refused() -> None:
    assert_config_error(shardlease(*node_args("file://host/path")), "file:///")


def test_a_missing_required_option_is_a_usage_error() -> None:
    result = shardlease("node", "--store", "memory://x", "--cluster", "c", "--name", "a")
    assert_config_error(result, "--shards")


def test_an_unusable_file_store_exits_1_without_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = shardlease(*node_args(f"file://{blocker}/store"))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert str(blocker) in result.stderr


def test_owners_refuses_zero_shards_and_unknown_stores(tmp_path: Path) -> None:
    assert_config_error(shardlease("owners", "--store", f"file://{tmp_path}", "--cluster", "c",
                                   "--shards", "0"), "--shards")
    assert_config_error(shardlease("owners", "--store", "nope://x", "--cluster", "c"), "nope")
    assert_config_error(shardlease("owners", "--store", f"file://{tmp_path}", "--cluster", "c",
                                   "-o", "yaml"), "-o")


def test_demo_refuses_a_memory_store_and_one_node() -> None:
    assert_config_error(shardlease("demo", "--store", "memory://x"), "memory")
    assert_config_error(shardlease("demo", "--nodes", "1"), "--nodes")


async def test_owners_json_has_one_entry_per_shard_sorted(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for shard, owner, generation in [(2, "b", 3), (0, "a", 1), (4, None, 7)]:
        await store.create_lease(Lease(cluster="c", shard=shard, owner=owner,
                                       generation=generation, write_id=new_write_id(), ttl=3))
    path = store.lease_path("c", 3)
    path.write_bytes(b"{not json")

    result = shardlease("owners", "--store", f"file://{tmp_path}", "--cluster", "c",
                        "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # one JSON object, nothing else on stdout
    # No node ever ran: the owners have no heartbeat; these records carry no `since`.
    assert doc["shards"] == [
        {"shard": 0, "owner": "a", "generation": 1, "since": None, "heartbeat": False,
         "renewal": "shard"},
        {"shard": 1, "owner": None, "generation": 0, "since": None, "heartbeat": None,
         "renewal": None},
        {"shard": 2, "owner": "b", "generation": 3, "since": None, "heartbeat": False,
         "renewal": "shard"},
        {"shard": 3, "owner": None, "generation": 0, "since": None, "heartbeat": None,
         "renewal": None},
        {"shard": 4, "owner": None, "generation": 7, "since": None, "heartbeat": None,
         "renewal": None},
    ]
    assert "shard 3" in result.stderr and "corrupt" in result.stderr

    result = shardlease("owners", "--store", f"file://{tmp_path}", "--cluster", "c",
                        "--shards", "8", "-o", "json")
    shards = json.loads(result.stdout)["shards"]
    assert [s["shard"] for s in shards] == list(range(8))
    assert shards[7] == {"shard": 7, "owner": None, "generation": 0, "since": None,
                         "heartbeat": None, "renewal": None}


def test_owners_of_an_empty_cluster_is_an_empty_list(tmp_path: Path) -> None:
    result = shardlease("owners", "--store", f"file://{tmp_path}", "--cluster", "c",
                        "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["shards"] == []


def test_owners_of_a_file_store_that_does_not_exist_says_so_and_fails(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    result = shardlease("owners", "--store", f"file://{missing}", "--cluster", "c")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert f"{missing} does not exist" in result.stderr
    assert not missing.exists(), "a read-only command must not create the store"


def test_owners_watch_prints_a_document_per_read_and_rides_out_a_missing_store(
        tmp_path: Path) -> None:
    """`--watch`: one JSON document per line and read; a store that is not
    there yet is reported and read again, and a lease written meanwhile
    shows in a later read; SIGTERM ends it."""
    store_dir = tmp_path / "later"
    watch = subprocess.Popen([sys.executable, "-m", "shardlease", "owners", "--store",
                              f"file://{store_dir}", "--cluster", "c", "--shards", "2",
                              "-o", "json", "--watch", "0.1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert watch.stderr is not None and watch.stdout is not None
        assert "does not exist" in watch.stderr.readline()
        assert "read again in 0.1s" in watch.stderr.readline()
        store = FileStore(store_dir)
        store_dir.mkdir()
        asyncio.run(store.create_lease(Lease(cluster="c", shard=1, owner="a", generation=4,
                                             write_id=new_write_id(), ttl=3)))
        doc = json.loads(watch.stdout.readline())
        assert [(s["shard"], s["owner"], s["generation"]) for s in doc["shards"]] \
            == [(0, None, 0), (1, "a", 4)]
        assert json.loads(watch.stdout.readline()) == doc  # read again, unchanged
    finally:
        watch.terminate()
        watch.wait(10)


@pytest.mark.parametrize("every", ["0", "-1", "5000"])
def test_owners_watch_refuses_a_period_out_of_range(tmp_path: Path, every: str) -> None:
    assert_config_error(shardlease("owners", "--store", f"file://{tmp_path}", "--cluster", "c",
                                   "--watch", every), "--watch")


def test_the_owners_table_aligns_columns_and_sums_up_per_owner() -> None:
    now = 1_000_000.0
    rows = [OwnerRow(0, "node-a", 1, now - 42, True), OwnerRow(1, None, 0, now - 600),
            OwnerRow(10, "node-bb", 12, 0.0, False)]
    lines = owners_table(rows, now=now).splitlines()
    assert lines[0].split() == ["SHARD", "OWNER", "GENERATION", "SINCE"]
    assert [line.index(line.split()[1]) for line in lines[:4]] == [7] * 4
    assert lines[1].split() == ["0", "node-a", "1", "42s"]
    assert lines[2].split() == ["1", "-", "0", "10m"]
    assert lines[3].split() == ["10", "node-bb", "*", "12", "-"]  # no heartbeat
    assert "node-a: 1 shard(s): 0" in lines
    assert "node-bb: 1 shard(s): 10" in lines
    assert "(unowned): 1 shard(s): 1" in lines
    assert lines[-1].startswith("* no heartbeat from this owner")
    assert not owners_table(rows[:2], now=now).splitlines()[-1].startswith("*")


def test_peers_parse_as_name_equals_address() -> None:
    assert parse_peers(["a=10.0.0.1:80", "b=x=y"]) == {"a": "10.0.0.1:80", "b": "x=y"}
    with pytest.raises(ConfigError):
        parse_peers(["=addr"])


def test_python_dash_m_and_the_console_script_agree() -> None:
    script = Path(sys.executable).parent / "shardlease"
    by_script = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                               timeout=60)
    by_module = shardlease("--help")
    assert by_module.returncode == by_script.returncode == 0
    assert by_module.stdout == by_script.stdout
    for command in ("node", "owners", "demo", "bench", "verify"):
        assert command in by_module.stdout


def test_the_parser_needs_no_temporary_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent runs this parser in a container whose root filesystem is
    read-only and has no /tmp: building it must touch no file (a real pod
    crashed on tempfile.gettempdir() here)."""
    import tempfile

    from shardlease.cli import build_parser

    def no_tmp() -> str:
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", no_tmp)
    args = build_parser().parse_args(["agent", "--shardset", "db", "--namespace", "n",
                                      "--name", "db-0"])
    assert args.shardset == "db"



def test_the_agent_command_reads_tls_connections_in_small_pieces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before its event loop starts, `shardlease agent` makes every TLS
    connection of the process keep a read buffer of 32 KiB, not 256 KiB."""
    import asyncio.sslproto

    from shardlease.cli import main
    from shardlease.k8s import agent

    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size",
                        asyncio.sslproto.SSLProtocol.max_size)  # restored after the test
    seen: list[int] = []

    class Agent:
        def __init__(self, **_: object) -> None:
            pass

        async def run(self) -> None:
            seen.append(asyncio.sslproto.SSLProtocol.max_size)

    monkeypatch.setattr(agent, "Agent", Agent)
    assert main(["agent", "--shardset", "db", "--namespace", "n", "--name", "db-0"]) == 0
    assert seen == [32 * 1024]

# An install without the development tools, or without the demo's extra:
# their import is refused as if they were not there.
WITHOUT = """
import sys, importlib.abc
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in %r:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
from shardlease.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("absent", "argv", "says"), [
    (("shardlease_tools",), ["bench", "--quick"], "pip install ./tools"),
    (("shardlease_tools",), ["verify", "--history", "h.jsonl"], "pip install ./tools"),
    (("rich",), ["demo"], "pip install 'shardlease[demo]'"),
])
def test_a_tool_that_is_not_installed_says_what_to_install_in_one_line(
        absent: tuple[str, ...], argv: list[str], says: str) -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT % (absent,), *argv],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
