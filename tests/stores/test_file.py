"""The store contract for the local directory store, and what is particular to it:
several OS processes sharing one directory, paths, permissions and names."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardlease.errors import ConfigError, Conflict, StoreError
from shardlease.records import MAX_RECORD_BYTES, encode
from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore
from shardlease.stores.file import FileStore

from .contract import (
    CLUSTER,
    MakeStore,
    PutRaw,
    StoreContract,
    make_heartbeat,
    make_lease,
    rewrite,
    valid,
)


def plant(store: FileStore, cluster: str, shard: int, data: bytes) -> None:
    path = store.lease_path(cluster, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class TestFileStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[LeaseStore]:
        store = FileStore(tmp_path / "store")
        yield store
        await store.aclose()

    @pytest.fixture
    def put_raw(self, store: LeaseStore) -> PutRaw:
        assert isinstance(store, FileStore)

        async def put(cluster: str, shard: int, data: bytes) -> None:
            plant(store, cluster, shard, data)
        return put

    @pytest.fixture
    def make_second_store(self, store: LeaseStore) -> MakeStore:
        assert isinstance(store, FileStore)

        async def make() -> LeaseStore:
            return FileStore(store.root)
        return make


# -- several processes -----------------------------------------------------------

#: Run in each child process: `workers` clients that each make `attempts`
#: read-then-swap claims of one lease, bumping the generation; prints wins.
HAMMER = """
import asyncio, os, sys, time
from shardlease.errors import Conflict
from shardlease.records import new_write_id
from shardlease.stores.file import FileStore

root, me, workers, attempts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

async def worker(n):
    store = FileStore(root)
    wins = 0
    for _ in range(attempts):
        current = await store.get_lease("hammer", 0)
        lease = current.record
        claim = lease.model_copy(update={"owner": f"{me}-{n}", "generation": lease.generation + 1,
                                         "write_id": new_write_id()})
        try:
            await store.update_lease(claim, current.version)
            wins += 1
        except Conflict:
            pass
    return wins

async def main():
    while not os.path.exists(os.path.join(root, "go")):  # start together
        time.sleep(0.001)
    print(sum(await asyncio.gather(*(worker(n) for n in range(workers)))))

asyncio.run(main())
"""

#: Run in each child process: one create of a missing lease; prints won/lost.
CREATE = """
import asyncio, os, sys, time
from shardlease.errors import Conflict
from shardlease.records import Lease, new_write_id
from shardlease.stores.file import FileStore

root, me = sys.argv[1], sys.argv[2]

async def main():
    store = FileStore(root)
    lease = Lease(cluster="race", shard=0, owner=me, generation=1, write_id=new_write_id(), ttl=15)
    while not os.path.exists(os.path.join(root, "go")):
        time.sleep(0.001)
    try:
        await store.create_lease(lease)
        print("won")
    except Conflict:
        print("lost")

asyncio.run(main())
"""


async def run_children(root: Path, script: str, args: list[list[str]]) -> list[str]:
    """Start one Python process per argument list, let them go at once, and
    return what each printed."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, str(root), *a,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        for a in args
    ]
    await asyncio.sleep(0.3)  # let them all import and wait for the start file
    (root / "go").touch()
    outputs = []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode == 0, err.decode()
        outputs.append(out.decode().strip())
    return outputs


@pytest.mark.slow
async def test_processes_hammering_one_lease_lose_no_update(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = FileStore(root)
    await store.create_lease(make_lease(shard=0, cluster="hammer", owner=None, generation=0))

    outputs = await run_children(root, HAMMER, [[f"p{i}", "3", "40"] for i in range(6)])

    wins = sum(int(o) for o in outputs)
    final = valid(await store.get_lease("hammer", 0))
    # Every successful swap raised the generation by one from the version it
    # read: any lost update would leave the generation below the wins.
    assert final.generation == wins
    assert 0 < wins <= 6 * 3 * 40
    leftovers = [p.name for p in (root / "hammer" / "leases").iterdir() if p.name != "0.json"]
    assert leftovers == [], "temporary files were left behind"


@pytest.mark.slow
async def test_processes_racing_to_create_one_lease_have_exactly_one_winner(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    outputs = await run_children(root, CREATE, [[f"p{i}"] for i in range(8)])
    assert sorted(outputs) == ["lost"] * 7 + ["won"]
    winner = valid(await FileStore(root).get_lease("race", 0))
    assert winner.owner == f"p{outputs.index('won')}"


# -- the directory ------------------------------------------------------------------


def test_describe_names_the_root_as_a_file_url(tmp_path: Path) -> None:
    assert FileStore(tmp_path / "x").describe() == f"file://{tmp_path}/x"


def test_a_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert FileStore("rel").root == tmp_path / "rel"


def test_open_store_makes_a_file_store_from_a_file_url(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/leases")
    assert isinstance(store, FileStore)
    assert store.root == tmp_path / "leases"
    assert isinstance(open_store(f"file://localhost{tmp_path}"), FileStore)


@pytest.mark.parametrize("url", ["file://host/x", "file://other.example/tmp/x", "file://"])
def test_open_store_refuses_a_file_url_with_a_host_or_without_a_path(url: str) -> None:
    with pytest.raises(ConfigError, match="file:///"):
        open_store(url)


async def test_directories_are_created_on_the_first_write(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "store"
    store = FileStore(root)
    assert await store.list_leases(CLUSTER) == {}
    assert not root.exists(), "a read must not create the store"
    await store.create_lease(make_lease(shard=0))
    assert (root / CLUSTER / "leases" / "0.json").is_file()


async def test_a_root_that_cannot_be_created_is_a_store_error_naming_the_path(
        tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "store"
    store = FileStore(root)
    with pytest.raises(StoreError, match=str(root)) as caught:
        await store.create_lease(make_lease())
    assert not isinstance(caught.value, Conflict)
    with pytest.raises(StoreError, match=str(root)):
        await store.put_heartbeat(make_heartbeat())
    with pytest.raises(StoreError, match=str(root)):
        await store.check()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
async def test_a_read_only_root_is_a_store_error_naming_the_path(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        store = FileStore(root)
        with pytest.raises(StoreError, match=str(root)):
            await store.check()
        with pytest.raises(StoreError, match=str(root)):
            await store.create_lease(make_lease())
    finally:
        root.chmod(0o700)


async def test_check_creates_the_root_and_leaves_nothing_behind(tmp_path: Path) -> None:
    root = tmp_path / "new" / "store"
    store = FileStore(root)
    await store.check()
    assert root.is_dir()
    assert list(root.iterdir()) == []
    await store.check()  # and again, on the existing root


async def test_the_version_is_a_hash_of_the_stored_bytes(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    version = await store.create_lease(make_lease(shard=0))
    data = store.lease_path(CLUSTER, 0).read_bytes()
    assert version == hashlib.sha256(data).hexdigest()[:32]


async def test_every_call_counts_exactly_one_request(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.list_leases(CLUSTER)
    version = await store.create_lease(make_lease(shard=0))
    await store.update_lease(rewrite(make_lease(shard=0)), version)
    with pytest.raises(Conflict):
        await store.update_lease(make_lease(shard=0), version)
    await store.get_lease(CLUSTER, 0)
    await store.put_heartbeat(make_heartbeat())
    await store.list_heartbeats(CLUSTER)
    await store.delete_heartbeat(CLUSTER, "node-a")
    assert dict(store.requests) == {"list": 2, "put": 4, "get": 1, "delete": 1}


@pytest.mark.parametrize("node", ["a/b", "../escape", ".hidden", "x" * 253])
async def test_node_names_that_are_not_one_safe_file_name_are_refused(
        tmp_path: Path, node: str) -> None:
    store = FileStore(tmp_path / "store")
    with pytest.raises(StoreError, match="node name"):
        await store.put_heartbeat(make_heartbeat(node))
    with pytest.raises(StoreError, match="node name"):
        await store.delete_heartbeat(CLUSTER, node)
    assert not (tmp_path / "escape.json").exists()


@pytest.mark.parametrize("cluster", ["a/b", "..", ".lock"])
async def test_cluster_names_that_are_not_one_safe_file_name_are_refused(
        tmp_path: Path, cluster: str) -> None:
    store = FileStore(tmp_path / "store")
    with pytest.raises(StoreError, match="cluster name"):
        await store.list_leases(cluster)
    with pytest.raises(StoreError, match="cluster name"):
        await store.create_lease(make_lease(cluster=cluster))


async def test_temporary_and_stray_files_are_not_listed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_lease(make_lease(shard=1))
    await store.put_heartbeat(make_heartbeat("node-a"))
    leases = tmp_path / CLUSTER / "leases"
    beats = tmp_path / CLUSTER / "heartbeats"
    for directory in (leases, beats):
        (directory / ".tmp-0123").write_bytes(b"half written")
        (directory / "notes.txt").write_text("hello")
    (leases / "01.json").write_bytes(encode(make_lease(shard=1)))
    (leases / "-1.json").write_bytes(b"{}")
    (leases / "abc.json").write_bytes(b"{}")
    assert sorted(await store.list_leases(CLUSTER)) == [1]
    assert sorted(await store.list_heartbeats(CLUSTER)) == ["node-a"]


async def test_files_vanishing_while_listing_are_skipped(tmp_path: Path) -> None:
    class Vanishing(FileStore):
        def _listdir(self, directory: Path) -> list[str]:
            return [*super()._listdir(directory), "9.json", "ghost.json"]

    store = Vanishing(tmp_path)
    await store.create_lease(make_lease(shard=1))
    await store.put_heartbeat(make_heartbeat("node-a"))
    assert sorted(await store.list_leases(CLUSTER)) == [1]
    assert sorted(await store.list_heartbeats(CLUSTER)) == ["node-a"]


async def test_an_unreadable_lease_file_is_reported_and_the_others_still_listed(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    good = make_lease(shard=0)
    await store.create_lease(good)
    store.lease_path(CLUSTER, 3).mkdir()  # a directory where a lease file should be
    listed = await store.list_leases(CLUSTER)
    assert sorted(listed) == [0, 3]
    assert valid(listed[0]) == good
    assert listed[3].record is None and listed[3].error and "3.json" in listed[3].error
    entry = await store.get_lease(CLUSTER, 3)
    assert entry is not None and entry.record is None
    with pytest.raises(StoreError):
        await store.update_lease(make_lease(shard=3), listed[3].version)


async def test_rewriting_the_tail_of_an_oversize_record_changes_its_version(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    head = b"x" * (MAX_RECORD_BYTES + 1)
    plant(store, CLUSTER, 0, head + b"first tail")
    first = await store.get_lease(CLUSTER, 0)
    plant(store, CLUSTER, 0, head + b"a longer second tail")
    second = await store.get_lease(CLUSTER, 0)
    assert first is not None and second is not None
    assert first.record is None and second.record is None
    assert first.version != second.version


async def test_a_write_waiting_too_long_for_the_lock_fails_without_writing(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path, lock_timeout=0.2)
    lease = make_lease(shard=0)
    version = await store.create_lease(lease)
    fd = os.open(tmp_path / CLUSTER / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another writer, stuck
        with pytest.raises(StoreError, match="lock") as caught:
            await store.update_lease(rewrite(lease), version)
        assert not isinstance(caught.value, Conflict)
    finally:
        os.close(fd)
    got = await store.get_lease(CLUSTER, 0)
    assert got is not None and got.version == version
    await store.update_lease(rewrite(lease), version)  # free again


async def test_a_write_waits_for_a_lock_held_briefly(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    lease = make_lease(shard=0)
    version = await store.create_lease(lease)
    fd = os.open(tmp_path / CLUSTER / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    write = asyncio.create_task(store.update_lease(rewrite(lease), version))
    await asyncio.sleep(0.1)
    assert not write.done()
    os.close(fd)
    new = await asyncio.wait_for(write, timeout=5)
    assert new != version


async def test_a_fifo_planted_as_a_lease_is_reported_without_hanging(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_lease(make_lease(shard=0))
    os.mkfifo(store.lease_path(CLUSTER, 2))
    listed = await asyncio.wait_for(store.list_leases(CLUSTER), timeout=5)
    assert sorted(listed) == [0, 2]
    assert listed[2].record is None and listed[2].error and "regular file" in listed[2].error


async def test_an_unreadable_heartbeat_file_does_not_hide_the_others(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put_heartbeat(make_heartbeat("node-a"))
    (tmp_path / CLUSTER / "heartbeats" / "node-b.json").mkdir()
    first = await store.list_heartbeats(CLUSTER)
    assert sorted(first) == ["node-a", "node-b"]
    assert (await store.list_heartbeats(CLUSTER))["node-b"] == first["node-b"]
