"""Local directory store: processes of one machine sharing a directory (the demo).

Layout under the root::

    <root>/<cluster>/.lock                  exclusive flock taken by every write
    <root>/<cluster>/leases/<shard>.json    one lease per shard
    <root>/<cluster>/heartbeats/<node>.json one heartbeat per node

A record's version is a hash of its bytes. Every record shardlease writes
carries a fresh `write_id`, so every write changes the version.

Compare-and-swap across processes: a write takes an exclusive `fcntl.flock` on
the cluster's lock file, reads the current bytes, compares their version with
the expected one, writes a temporary file in the same directory, fsyncs it and
`os.replace`s it over the record (then fsyncs the directory, so a crash cannot
bring back an older lease and with it an older generation). Reads take no lock:
`os.replace` is atomic, so a reader sees the old record or the new one whole.

Blocking file I/O runs in `asyncio.to_thread`, one thread hop per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from shardlease.errors import Conflict, StoreError, StoreUnsafe
from shardlease.records import MAX_RECORD_BYTES, Heartbeat, Lease, Stored, encode, stored_lease
from shardlease.stores.base import LeaseStore

_SUFFIX = ".json"
_LOCK = ".lock"
_TMP_PREFIX = ".tmp-"
#: Longest file name most local file systems accept, in bytes.
_NAME_MAX = 255


def _version(data: bytes, size: int, mtime_ns: int) -> str:
    """The version of a record read as `data` (at most MAX_RECORD_BYTES + 1
    bytes). A record that big is corrupt and was only partly read: its size and
    mtime are mixed in so that rewriting its tail still changes its version."""
    digest = hashlib.sha256(data)
    if len(data) > MAX_RECORD_BYTES:
        digest.update(f"|{size}|{mtime_ns}".encode())
    return digest.hexdigest()[:32]


class FileStore(LeaseStore):
    """Leases and heartbeats as files in a directory shared by local processes."""

    def __init__(self, root: str | os.PathLike[str], lock_timeout: float = 10.0) -> None:
        super().__init__()
        self.root = Path(os.path.abspath(os.fspath(root)))
        #: Seconds a write waits for another process's write lock before it
        #: fails with StoreError (a stopped process must not hang every writer).
        self.lock_timeout = lock_timeout

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

    def lease_path(self, cluster: str, shard: int) -> Path:
        """Where the lease of `shard` lives (tests plant raw bytes there)."""
        if shard < 0:
            raise StoreError(f"file store {self.root}: shard {shard} is negative")
        return self.cluster_dir(cluster) / "leases" / f"{shard}{_SUFFIX}"

    def heartbeat_path(self, cluster: str, node: str) -> Path:
        return (self.cluster_dir(cluster) / "heartbeats"
                / f"{self._checked_name('node', node)}{_SUFFIX}")

    def _fail(self, what: str, path: Path, e: OSError) -> StoreError:
        reason = e.strerror or str(e)
        return StoreError(f"file store {self.root}: cannot {what} {path}: {reason}")

    # -- blocking helpers (run in a worker thread) ----------------------------

    def _read(self, path: Path) -> tuple[str, bytes] | None:
        """(version, bytes) of a record, or None if it does not exist. Reads at
        most MAX_RECORD_BYTES + 1 bytes, enough to tell an oversize record.
        Raises OSError when it exists but cannot be read as a regular file."""
        try:
            # O_NONBLOCK: a FIFO planted as a record must not hang the reader.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            chunks: list[bytes] = []
            left = MAX_RECORD_BYTES + 1
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        return _version(data, st.st_size, st.st_mtime_ns), data

    def _read_current(self, path: Path) -> str | None:
        """The version of a record about to be swapped (None: absent)."""
        try:
            read = self._read(path)
        except OSError as e:
            raise self._fail("read", path, e) from None
        return None if read is None else read[0]

    def _read_lease(self, path: Path, cluster: str, shard: int) -> Stored[Lease] | None:
        """A lease as read, never raising for what is wrong with this one file:
        an unreadable file (a directory, no permission) is reported like a
        corrupt record, so one bad file cannot hide the others."""
        try:
            read = self._read(path)
        except OSError as e:
            return Stored(f"unreadable-{e.errno}", None,
                          f"cannot read {path}: {e.strerror or e}")
        return None if read is None else stored_lease(read[1], read[0], cluster, shard)

    def _listdir(self, directory: Path) -> list[str]:
        """The record file names of a directory (missing: none), sorted."""
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise self._fail("list", directory, e) from None
        return sorted(n for n in names if n.endswith(_SUFFIX) and not n.startswith("."))

    def _makedirs(self, directory: Path) -> None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise self._fail("create directory", directory, e) from None

    @contextlib.contextmanager
    def _locked(self, cluster: str) -> Iterator[None]:
        """Hold the cluster's write lock (exclusive flock; blocks until free)."""
        directory = self.cluster_dir(cluster)
        self._makedirs(directory)
        lock_path = directory / _LOCK
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self._fail("open lock file", lock_path, e) from None
        try:
            deadline = time.monotonic() + self.lock_timeout
            pause = 0.0005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            f"file store {self.root}: lock {lock_path} still held by another "
                            f"writer after {self.lock_timeout:g}s") from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.01)
                except OSError as e:
                    raise self._fail("lock", lock_path, e) from None
            yield
        finally:
            os.close(fd)  # releases the flock

    def _write(self, path: Path, data: bytes) -> None:
        """Atomically replace `path` with `data` (the caller holds the lock)."""
        directory = path.parent
        self._makedirs(directory)
        tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._fail("write", path, e) from None
        self._fsync_dir(directory)

    def _fsync_dir(self, directory: Path) -> None:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise self._fail("open directory", directory, e) from None
        try:
            os.fsync(fd)
        except OSError as e:
            # Some file systems cannot fsync a directory; the rename is done.
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise self._fail("sync directory", directory, e) from None
        finally:
            os.close(fd)

    def _encode(self, record: Lease | Heartbeat) -> bytes:
        data = encode(record)
        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(f"file store {self.root}: record of {len(data)} bytes is larger "
                             f"than the {MAX_RECORD_BYTES} readers accept")
        return data

    # -- sync bodies of the calls ---------------------------------------------

    def _list_leases(self, cluster: str) -> dict[int, Stored[Lease]]:
        directory = self.cluster_dir(cluster) / "leases"
        found: dict[int, Stored[Lease]] = {}
        for name in self._listdir(directory):
            stem = name[: -len(_SUFFIX)]
            if not stem.isascii() or not stem.isdigit() or str(int(stem)) != stem:
                continue  # not a lease file of ours
            shard = int(stem)
            stored = self._read_lease(directory / name, cluster, shard)
            if stored is not None:  # else vanished while listing
                found[shard] = stored
        return found

    def _get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        return self._read_lease(self.lease_path(cluster, shard), cluster, shard)

    def _swap_lease(self, lease: Lease, version: str | None) -> str:
        """Write the lease if its current version is `version` (None: absent)."""
        path = self.lease_path(lease.cluster, lease.shard)
        data = self._encode(lease)
        with self._locked(lease.cluster):
            current = self._read_current(path)
            if version is None:
                if current is not None:
                    raise Conflict(f"lease {lease.cluster}/{lease.shard} exists")
            elif current != version:
                raise Conflict(
                    f"lease {lease.cluster}/{lease.shard} changed since version {version}")
            self._write(path, data)
        return _version(data, len(data), 0)  # what a reader will compute

    def _list_heartbeats(self, cluster: str) -> dict[str, str]:
        directory = self.cluster_dir(cluster) / "heartbeats"
        found: dict[str, str] = {}
        for name in self._listdir(directory):
            try:
                read = self._read(directory / name)
            except OSError as e:
                # Unreadable: a version that never changes, so it looks dead.
                found[name[: -len(_SUFFIX)]] = f"unreadable-{e.errno}"
                continue
            if read is not None:  # else deleted while listing
                found[name[: -len(_SUFFIX)]] = read[0]
        return found

    def _put_heartbeat(self, heartbeat: Heartbeat) -> None:
        path = self.heartbeat_path(heartbeat.cluster, heartbeat.node)
        data = self._encode(heartbeat)
        with self._locked(heartbeat.cluster):
            self._write(path, data)

    def _delete_heartbeat(self, cluster: str, node: str) -> None:
        path = self.heartbeat_path(cluster, node)
        if not self.cluster_dir(cluster).exists():
            return  # nothing was ever written for this cluster
        with self._locked(cluster):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            except OSError as e:
                raise self._fail("delete", path, e) from None
            self._fsync_dir(path.parent)

    def _check(self) -> None:
        self._makedirs(self.root)
        try:
            os.listdir(self.root)
        except OSError as e:
            raise self._fail("list", self.root, e) from None
        probe = self.root / f"{_TMP_PREFIX}check-{uuid.uuid4().hex}"
        try:
            fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self._fail("write a probe file in", self.root, e) from None
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                raise StoreUnsafe(
                    f"file store {self.root}: the file system does not support flock "
                    f"({e.strerror or e}), so writes cannot be compare-and-swap; "
                    "use a local directory"
                ) from None
        except OSError as e:
            raise self._fail("write a probe file in", self.root, e) from None
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(probe)

    # -- the interface ----------------------------------------------------------

    async def check(self) -> None:
        await asyncio.to_thread(self._check)

    async def list_leases(self, cluster: str) -> dict[int, Stored[Lease]]:
        self._count("list")
        return await asyncio.to_thread(self._list_leases, cluster)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        self._count("get")
        return await asyncio.to_thread(self._get_lease, cluster, shard)

    async def create_lease(self, lease: Lease) -> str:
        self._count("put")
        return await asyncio.to_thread(self._swap_lease, lease, None)

    async def update_lease(self, lease: Lease, version: str) -> str:
        self._count("put")
        return await asyncio.to_thread(self._swap_lease, lease, version)

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        self._count("list")
        return await asyncio.to_thread(self._list_heartbeats, cluster)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        self._count("put")
        await asyncio.to_thread(self._put_heartbeat, heartbeat)

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        self._count("delete")
        await asyncio.to_thread(self._delete_heartbeat, cluster, node)
