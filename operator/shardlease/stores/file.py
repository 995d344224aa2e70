"""Local directory store: processes of one machine sharing a directory (the demo).

Layout under the root::

    <root>/<cluster>/leases/<shard>/<seq>.json   the versions of one lease
    <root>/<cluster>/heartbeats/<node>.json      one heartbeat per node
    <root>/<cluster>/epochs/<node>@<epoch>/<seq>.json   the versions of an epoch

No locks. A lock held by a writer that is then stopped (SIGSTOP, a debugger, a
frozen VM) would block every other writer for as long as it stays stopped,
which is exactly when the others must take its leases over. So every lease
write is one atomic system call that cannot be left half done:

- a lease is a series of files `1.json`, `2.json`, ...; the highest is the
  current record, and its version is `<seq>-<sha256 of its bytes>`;
- a compare-and-swap from version `<n>-<hash>` checks that `n.json` still has
  that hash, writes the new record to a temporary file (fsynced), then
  `os.link`s it to `<n+1>.json`, which fails if that name exists: of all the
  writers that read version n, exactly one creates `n+1`;
- creating a lease is a swap from "nothing" to `1.json`.

A writer keeps the newest `_KEEP + 1` versions and removes older ones. A stale
writer whose target name was removed that way could create it again; but then
a version more than `_KEEP` above it exists, which it sees when it lists the
directory after linking, and it reports a `Conflict`. Such a leftover is never
the highest version, so no reader ever takes it for the current record. (A
writer delayed while more than `_KEEP` others swapped after it also reports a
Conflict: the safe direction, since by then its lease was taken anyway.)

Epoch records (node-mode renewal) are versioned and swapped like leases.
Heartbeats need no compare-and-swap (each node writes only its own): they are
written to a temporary file and `os.replace`d, which is atomic.

Readers take no lock either; they tolerate files vanishing while they list.
The root must be on a local file system with hard links (`check()` verifies).
Blocking file I/O runs in `asyncio.to_thread`, one thread hop per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import shutil
import stat
import time
import uuid
from pathlib import Path

from shardlease.errors import Conflict, StoreError, StoreUnsafe
from shardlease.records import (
    MAX_RECORD_BYTES,
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    decode_heartbeat,
    encode,
    stored_epoch,
    stored_lease,
)
from shardlease.stores.base import EpochListing, LeaseStore, Listed
from shardlease.stores.requests import RequestObservers

_SUFFIX = ".json"
_TMP_PREFIX = ".tmp-"
#: Versions of a lease kept below the current one. Every process sharing a
#: directory must use the same value: the stale-writer check depends on it.
_KEEP = 32
#: Temporary files older than this (seconds) are leftovers of a crashed writer.
_STALE_TMP_SECONDS = 600.0
#: Reads of one lease retried when its newest version is collected meanwhile.
_READ_TRIES = 20
#: Longest file name most local file systems accept, in bytes.
_NAME_MAX = 255


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _parse_version(version: str) -> tuple[int, str] | None:
    seq, sep, digest = version.partition("-")
    if not sep or not seq.isascii() or not seq.isdigit() or not digest:
        return None
    return int(seq), digest


def _seq_of(name: str) -> int | None:
    """The version number of a lease version file name, or None."""
    if not name.endswith(_SUFFIX):
        return None
    stem = name[: -len(_SUFFIX)]
    if not stem.isascii() or not stem.isdigit() or stem.startswith("0"):
        return None
    return int(stem)


def _read_bytes(path: Path) -> tuple[bytes, int]:
    """At most MAX_RECORD_BYTES + 1 bytes of a record, and the file's size
    (to say how far over the limit an oversize one is). Raises
    FileNotFoundError, or OSError when the path exists but is not a readable
    regular file."""
    # O_NONBLOCK: a FIFO planted as a record must not hang the reader.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        left = MAX_RECORD_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data, max(info.st_size, len(data))
    finally:
        os.close(fd)


class FileStore(LeaseStore):
    """Leases and heartbeats as files in a directory shared by local processes."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        #: Told of every backend request this store makes (`stores.requests`).
        self.backend_requests = RequestObservers()
        self.root = Path(os.path.abspath(os.fspath(root)))

    def describe(self) -> str:
        return f"file://{self.root}"

    # -- paths ----------------------------------------------------------------

    def _checked_name(self, kind: str, name: str) -> str:
        """A cluster or node name usable as one file name, or StoreError."""
        if not name or "/" in name or "\0" in name or name.startswith("."):
            raise StoreError(
                f"file store {self.root}: {kind} name {name!r} cannot be stored: it must be "
                "non-empty, contain no '/' and not start with '.'"
            )
        if len((name + _SUFFIX).encode()) > _NAME_MAX:
            raise StoreError(
                f"file store {self.root}: {kind} name {name[:40]!r}... is too long for a file "
                f"name (at most {_NAME_MAX - len(_SUFFIX)} bytes)"
            )
        return name

    def cluster_dir(self, cluster: str) -> Path:
        return self.root / self._checked_name("cluster", cluster)

    def lease_dir(self, cluster: str, shard: int) -> Path:
        """The directory holding the versions of one lease."""
        if shard < 0:
            raise StoreError(f"file store {self.root}: shard {shard} is negative")
        return self.cluster_dir(cluster) / "leases" / str(shard)

    def epoch_dir(self, cluster: str, node: str, epoch: str) -> Path:
        return (self.cluster_dir(cluster) / "epochs"
                / f"{self._checked_name('node', node)}@{self._checked_name('epoch', epoch)}")

    def heartbeat_path(self, cluster: str, node: str) -> Path:
        return (self.cluster_dir(cluster) / "heartbeats"
                / f"{self._checked_name('node', node)}{_SUFFIX}")

    def _fail(self, what: str, path: Path, e: OSError) -> StoreError:
        reason = e.strerror or str(e)
        return StoreError(f"file store {self.root}: cannot {what} {path}: {reason}")

    # -- raw access, for tests and repairs -------------------------------------

    def lease_path(self, cluster: str, shard: int) -> Path:
        """The file that, once written, is the lease's current record: the
        next version's name (its directory is created). For tests that plant
        raw bytes; prefer `put_raw_lease`, which writes atomically."""
        directory = self.lease_dir(cluster, shard)
        self._makedirs(directory)
        seqs = self._seqs(directory)
        return directory / f"{(seqs[-1] if seqs else 0) + 1}{_SUFFIX}"

    def put_raw_lease(self, cluster: str, shard: int, data: bytes) -> None:
        """Write arbitrary bytes as the lease's new current version (tests of
        corrupt records)."""
        directory = self.lease_dir(cluster, shard)
        self._makedirs(directory)
        while True:
            seqs = self._seqs(directory)
            if self._link_new(directory, (seqs[-1] if seqs else 0) + 1, data):
                return

    # -- blocking helpers (run in a worker thread) ----------------------------

    def _makedirs(self, directory: Path) -> None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise self._fail("create directory", directory, e) from None

    def _listdir(self, directory: Path) -> list[str]:
        """The names in a directory; none if it is missing (or not one)."""
        try:
            return os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise self._fail("list", directory, e) from None

    def _seqs(self, directory: Path) -> list[int]:
        """The versions present in a lease directory, ascending."""
        return sorted(s for s in map(_seq_of, self._listdir(directory)) if s is not None)

    def _fsync_dir(self, directory: Path) -> None:
        """Make a rename, link or unlink in `directory` durable, so a crash
        cannot bring back an older lease (and with it an older generation)."""
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise self._fail("open directory", directory, e) from None
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # cannot sync dirs
                raise self._fail("sync directory", directory, e) from None
        finally:
            os.close(fd)

    def _write_tmp(self, directory: Path, data: bytes) -> Path:
        """A new fsynced temporary file holding `data`, in `directory`."""
        tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self._fail("write", tmp, e) from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._fail("write", tmp, e) from None
        os.close(fd)
        return tmp

    def _link_new(self, directory: Path, seq: int, data: bytes) -> bool:
        """Create version `seq` holding `data`, unless that name exists."""
        tmp = self._write_tmp(directory, data)
        target = directory / f"{seq}{_SUFFIX}"
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        except OSError as e:
            raise self._fail("create", target, e) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self._fsync_dir(directory)
        return True

    def _encode(self, record: Lease | Heartbeat | Epoch) -> bytes:
        data = encode(record)
        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(f"file store {self.root}: record of {len(data)} bytes is larger "
                             f"than the {MAX_RECORD_BYTES} readers accept")
        return data

    def _collect(self, directory: Path, seq: int) -> None:
        """Remove the versions more than _KEEP below `seq` and stale temporary
        files. Best effort: a failure here does not undo the write."""
        now = time.time()
        for name in self._listdir(directory):
            path = directory / name
            found = _seq_of(name)
            with contextlib.suppress(OSError):
                if found is not None and found < seq - _KEEP:
                    os.unlink(path)
                elif name.startswith(_TMP_PREFIX) \
                        and now - os.stat(path).st_mtime > _STALE_TMP_SECONDS:
                    os.unlink(path)

    # -- sync bodies of the calls ---------------------------------------------

    def _read_lease(self, directory: Path, cluster: str, shard: int) -> Stored[Lease] | None:
        """The current version of a lease, or None. What is wrong with this one
        lease (an unreadable file) is reported in the entry, not raised, so one
        bad lease cannot hide the others."""
        for _ in range(_READ_TRIES):
            seqs = self._seqs(directory)
            if not seqs:
                return None
            path = directory / f"{seqs[-1]}{_SUFFIX}"
            try:
                data, size = _read_bytes(path)
            except FileNotFoundError:
                continue  # superseded and collected since the listing: list again
            except OSError as e:
                return Stored(f"{seqs[-1]}-unreadable", None,
                              f"cannot read {path}: {e.strerror or e}")
            return stored_lease(data, f"{seqs[-1]}-{_digest(data)}", cluster, shard, size)
        raise StoreError(f"file store {self.root}: lease {cluster}/{shard} changed faster "
                         f"than it could be read ({_READ_TRIES} tries)")

    def _list_leases(self, cluster: str) -> dict[int, Stored[Lease]]:
        leases = self.cluster_dir(cluster) / "leases"
        found: dict[int, Stored[Lease]] = {}
        for name in self._listdir(leases):
            if not name.isascii() or not name.isdigit() or str(int(name)) != name:
                continue  # not a lease directory of ours
            shard = int(name)
            stored = self._read_lease(leases / name, cluster, shard)
            if stored is not None:
                found[shard] = stored
        return dict(sorted(found.items()))

    def _get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        return self._read_lease(self.lease_dir(cluster, shard), cluster, shard)

    def _swap_lease(self, lease: Lease, version: str | None) -> str:
        """Write the lease if its current version is `version` (None: absent)."""
        return self._swap(self.lease_dir(lease.cluster, lease.shard),
                          f"lease {lease.cluster}/{lease.shard}", self._encode(lease), version)

    def _swap(self, directory: Path, name: str, data: bytes, version: str | None) -> str:
        """Write a versioned record if its current version is `version` (None: absent)."""
        if version is None:
            if self._seqs(directory):
                raise Conflict(f"{name} exists")
            seq = 1
        else:
            parsed = _parse_version(version)
            if parsed is None:
                raise Conflict(f"{name}: {version!r} is not a version of this store")
            previous, digest = parsed
            path = directory / f"{previous}{_SUFFIX}"
            try:
                current, _ = _read_bytes(path)
            except FileNotFoundError:
                raise Conflict(f"{name} changed since version {version}") from None
            except OSError as e:
                raise self._fail("read", path, e) from None
            if _digest(current) != digest:
                raise Conflict(f"{name} changed since version {version}")
            seq = previous + 1
        self._makedirs(directory)
        if not self._link_new(directory, seq, data):
            raise Conflict(f"{name} exists" if version is None
                           else f"{name} changed since version {version}")
        seqs = self._seqs(directory)
        if seqs and seqs[-1] > seq + _KEEP:
            # Our name was collected and created again, or we were stalled
            # while many others wrote: either way ours is not the record.
            raise Conflict(f"{name} exists" if version is None
                           else f"{name} changed since version {version}")
        self._collect(directory, seq)
        return f"{seq}-{_digest(data)}"

    def _newest(self, directory: Path, what: str) -> tuple[int, bytes] | None:
        """(seq, bytes) of the newest version in a versioned directory, or
        None if it has none; re-listed when that version is collected meanwhile."""
        for _ in range(_READ_TRIES):
            seqs = self._seqs(directory)
            if not seqs:
                return None
            path = directory / f"{seqs[-1]}{_SUFFIX}"
            try:
                return seqs[-1], _read_bytes(path)[0]
            except FileNotFoundError:
                continue  # superseded and collected since the listing
            except OSError as e:
                raise self._fail("read", path, e) from None
        raise StoreError(f"file store {self.root}: {what} changed faster than it could be "
                         f"read ({_READ_TRIES} tries)")

    def _list_epochs(self, cluster: str) -> EpochListing:
        directory = self.cluster_dir(cluster) / "epochs"
        found: dict[tuple[str, str], str] = {}
        ended: set[tuple[str, str]] = set()
        for name in sorted(self._listdir(directory)):
            node, sep, epoch = name.rpartition("@")
            if not sep or not node or not epoch or name.startswith("."):
                continue
            try:
                newest = self._newest(directory / name, f"epoch {name}")
            except StoreError:
                # One unreadable epoch must not hide the others: a version that
                # never changes, so it reads as a silent epoch.
                found[(node, epoch)] = "unreadable"
                continue
            if newest is not None:
                found[(node, epoch)] = f"{newest[0]}-{_digest(newest[1])}"
                # (The listing has read the record anyway: ended is told for free.)
                record = stored_epoch(newest[1], "", cluster, node, epoch).record
                if record is not None and record.ended_by is not None:
                    ended.add((node, epoch))
        return EpochListing(found, frozenset(ended))

    def _get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        newest = self._newest(self.epoch_dir(cluster, node, epoch), f"epoch {node}@{epoch}")
        if newest is None:
            return None
        seq, data = newest
        return stored_epoch(data, f"{seq}-{_digest(data)}", cluster, node, epoch)

    def _swap_epoch(self, record: Epoch, version: str | None) -> str:
        return self._swap(self.epoch_dir(record.cluster, record.node, record.epoch),
                          f"epoch {record.cluster}/{record.node}@{record.epoch}",
                          self._encode(record), version)

    def _delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        directory = self.epoch_dir(cluster, node, epoch)
        # A writer that still holds a version of it then finds its file gone:
        # a Conflict, as for any epoch that changed.
        shutil.rmtree(directory, ignore_errors=True)
        if directory.exists():
            raise StoreError(f"file store {self.root}: cannot delete {directory}")
        if directory.parent.is_dir():
            self._fsync_dir(directory.parent)

    def _list_heartbeats(self, cluster: str) -> dict[str, str]:
        directory = self.cluster_dir(cluster) / "heartbeats"
        found: dict[str, str] = {}
        for name in sorted(self._listdir(directory)):
            if not name.endswith(_SUFFIX) or name.startswith("."):
                continue
            node = name[: -len(_SUFFIX)]
            try:
                found[node] = _digest(_read_bytes(directory / name)[0])
            except FileNotFoundError:
                continue  # deleted while listing
            except OSError as e:
                # Unreadable: a version that never changes, so it looks dead.
                found[node] = f"unreadable-{e.errno}"
        return found

    def _get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        path = self.heartbeat_path(cluster, node)
        try:
            data, _ = _read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._fail("read", path, e) from None
        # (At most MAX_RECORD_BYTES + 1 bytes: one more is refused as too big.)
        return decode_heartbeat(data, cluster, node)

    def _put_heartbeat(self, heartbeat: Heartbeat) -> None:
        path = self.heartbeat_path(heartbeat.cluster, heartbeat.node)
        data = self._encode(heartbeat)
        self._makedirs(path.parent)
        tmp = self._write_tmp(path.parent, data)
        try:
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._fail("write", path, e) from None
        self._fsync_dir(path.parent)

    def _delete_heartbeat(self, cluster: str, node: str) -> None:
        path = self.heartbeat_path(cluster, node)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            raise self._fail("delete", path, e) from None
        self._fsync_dir(path.parent)

    def _check_readable(self) -> None:
        try:
            info = os.stat(self.root)
        except FileNotFoundError:
            raise StoreError(f"file store {self.root} does not exist (no such directory); "
                             "a node creates it at start") from None
        except OSError as e:
            raise self._fail("read", self.root, e) from None
        if not stat.S_ISDIR(info.st_mode):
            raise StoreError(f"file store {self.root} is not a directory")
        self._listdir(self.root)

    def _check(self) -> None:
        self._makedirs(self.root)
        try:
            os.listdir(self.root)
        except OSError as e:
            raise self._fail("list", self.root, e) from None
        probe = self._write_tmp(self.root, b"probe")
        linked = self.root / f"{_TMP_PREFIX}link-{uuid.uuid4().hex}"
        try:
            try:
                os.link(probe, linked)
            except OSError as e:
                raise StoreUnsafe(
                    f"file store {self.root}: the file system cannot make hard links "
                    f"({e.strerror or e}), which its compare-and-swap needs; "
                    "use a directory on a local file system"
                ) from None
            try:
                os.link(probe, linked)
            except FileExistsError:
                pass
            else:
                raise StoreUnsafe(f"file store {self.root}: the file system lets a link "
                                  "replace an existing file; use a local file system")
        finally:
            for path in (probe, linked):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    # -- the interface ----------------------------------------------------------

    async def check(self) -> None:
        await asyncio.to_thread(self._check)

    async def check_readable(self) -> None:
        await asyncio.to_thread(self._check_readable)

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        self.backend_requests.report("list")
        return self._observed_all(cluster, await asyncio.to_thread(self._list_leases, cluster))

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        self.backend_requests.report("get")
        return self._observed_one(
            cluster, shard, await asyncio.to_thread(self._get_lease, cluster, shard))

    async def create_lease(self, lease: Lease) -> str:
        self.backend_requests.report("put")
        return await asyncio.to_thread(self._swap_lease, lease, None)

    async def update_lease(self, lease: Lease, version: str) -> str:
        self.backend_requests.report("put")
        return await asyncio.to_thread(self._swap_lease, lease, version)

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        self.backend_requests.report("list")
        return await asyncio.to_thread(self._list_heartbeats, cluster)

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        self.backend_requests.report("get")
        return await asyncio.to_thread(self._get_heartbeat, cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        self.backend_requests.report("put")
        await asyncio.to_thread(self._put_heartbeat, heartbeat)

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        self.backend_requests.report("delete")
        await asyncio.to_thread(self._delete_heartbeat, cluster, node)

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        self.backend_requests.report("list")
        return await asyncio.to_thread(self._list_epochs, cluster)

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        self.backend_requests.report("get")
        return await asyncio.to_thread(self._get_epoch, cluster, node, epoch)

    async def create_epoch(self, record: Epoch) -> str:
        self.backend_requests.report("put")
        return await asyncio.to_thread(self._swap_epoch, record, None)

    async def update_epoch(self, record: Epoch, version: str) -> str:
        self.backend_requests.report("put")
        return await asyncio.to_thread(self._swap_epoch, record, version)

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        self.backend_requests.report("delete")
        await asyncio.to_thread(self._delete_epoch, cluster, node, epoch)
