"""Which shard a key belongs to, and so which pod to send it to.

    h = int.from_bytes(sha256(key.encode("utf-8")).digest()[:8], "big")
    shard = jump(h, shards)

where `jump` is the jump consistent hash of Lamping and Veach ("A Fast,
Minimal Memory, Consistent Hash Algorithm", 2014):

    b, j = -1, 0
    while j < shards:
        b = j
        h = (h * 2862933555777941757 + 1) mod 2**64
        j = floor((b + 1) * (2**31 / ((h >> 33) + 1)))      # IEEE doubles
    return b

Why jump rather than `h % shards`: when `shards` grows from n to n + 1,
only the keys that now belong to shard n move (1 / (n + 1) of them; from 64
to 65 shards, 1.5 % instead of 98 %), and shrinking moves only the keys of
the shards removed. The hash is part of the contract with clients (they may
compute it themselves: SHA-256 and 64-bit integer arithmetic, the same in
every language; tests/test_routing.py pins vectors computed by an
independent implementation), and never changes.
"""

from __future__ import annotations

import hashlib

_MASK = (1 << 64) - 1


def jump(h: int, buckets: int) -> int:
    """The jump consistent hash of the 64-bit `h` into `buckets` buckets."""
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    b, j = -1, 0
    while j < buckets:
        b = j
        h = (h * 2862933555777941757 + 1) & _MASK
        j = int((b + 1) * (float(1 << 31) / float((h >> 33) + 1)))
    return b


def key_hash(key: str | bytes) -> int:
    """The first 8 bytes of the key's SHA-256 (UTF-8 for text), big-endian."""
    data = key.encode("utf-8") if isinstance(key, str) else key
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def shard_for_key(key: str | bytes, shards: int) -> int:
    if shards < 1:
        raise ValueError("shards must be at least 1")
    return jump(key_hash(key), shards)
