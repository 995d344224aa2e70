"""The S3 store's key layout: where each record lives under the prefix, and
what an object's name and ETag say."""

from __future__ import annotations

from shardlease.errors import ConfigError


def clean_etag(raw: str) -> str:
    """An ETag without quotes or a weak-validator prefix (shared with the example app)."""
    return raw.strip().removeprefix("W/").strip('"')


def _shard_number(name: str) -> int | None:
    """The shard of a key's last part: a canonical decimal number, else None."""
    if not name.isascii() or not name.isdigit() or str(int(name)) != name:
        return None
    return int(name)


#: The suffix of the empty object that marks an epoch record ended (epoch
#: ids are lower-case letters and digits: no record key ends so).
_ENDED = ".ended"


def _segment(kind: str, name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"{kind} name {name!r} cannot be part of an S3 key "
                          "(empty, '.', '..' or containing '/')")
    return name
