"""Lease stores behind one interface, chosen by URL.

- `memory://NAME`: in-process (tests, simulation);
- `file:///path`: a directory shared by processes of one machine (the demo);
- `s3://bucket/prefix`: S3 or an S3-compatible server with conditional writes;
- `kubernetes://NAMESPACE`: coordination.k8s.io/v1 Lease objects, read from a
  watch-fed cache (`?watch=0`: a LIST per read; `?watch_timeout=SECONDS`).

Each store reports the backend requests it makes to observers, which the
benchmark, the simulation and the tests attach (`stores.requests`); the
interface has no counter.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from shardlease.errors import ConfigError
from shardlease.stores.base import LeaseStore

__all__ = ["LeaseStore", "open_store"]

SCHEMES = ("memory", "file", "s3", "kubernetes")


def open_store(url: str) -> LeaseStore:
    """Make the store a URL names. Raises `ConfigError` for an unknown or
    malformed URL, with the accepted forms in the message."""
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme == "memory":
        from shardlease.stores.memory import MemoryStore, named_backend

        name = parts.netloc + parts.path
        return MemoryStore(named_backend(name), name=name)
    if scheme == "file":
        from shardlease.stores.file import FileStore

        if parts.netloc not in ("", "localhost") or not parts.path or parts.query \
                or parts.fragment:
            raise ConfigError(f"file store URL {url!r} must look like file:///absolute/path")
        return FileStore(unquote(parts.path))
    if scheme == "s3":
        from shardlease.stores.s3 import S3Store

        return S3Store.from_url(url)
    if scheme == "kubernetes":
        from shardlease.stores.kubernetes import KubernetesStore

        return KubernetesStore.from_url(url)
    raise ConfigError(
        f"unknown store URL {url!r}: use one of memory://NAME, file:///path, "
        "s3://bucket/prefix or kubernetes://NAMESPACE"
    )
