"""Which shard a key belongs to, and so which pod to send it to.

    shard = int.from_bytes(sha256(key.encode("utf-8")).digest()[:8], "big") % shards

The hash is part of the contract with clients (they may compute it
themselves), so it is SHA-256 — the same in every language — and never changes.
"""

from __future__ import annotations

import hashlib


def shard_for_key(key: str | bytes, shards: int) -> int:
    if shards < 1:
        raise ValueError("shards must be at least 1")
    data = key.encode("utf-8") if isinstance(key, str) else key
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") % shards
