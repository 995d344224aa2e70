"""The key-to-shard map (shardlease.routing): a contract with clients, so
pinned by vectors, and consistent: a change of the shard count moves only
the keys it must."""

from __future__ import annotations

import pytest

from shardlease.routing import jump, key_hash, shard_for_key

COUNTS = (1, 2, 7, 64, 65, 1000, 8192)


# Computed by an independent implementation (Go, the paper's figure 1 with
# crypto/sha256), not by this module.
@pytest.mark.parametrize(("key", "shards"), [
    ("user-42", (0, 0, 0, 15, 15, 424, 424)),
    ("", (0, 1, 5, 22, 22, 22, 2076)),
    ("k0", (0, 0, 5, 47, 47, 887, 3784)),
    ("k1", (0, 1, 3, 33, 33, 493, 4996)),
    ("a-longer-key/with/slashes", (0, 1, 1, 39, 39, 39, 1515)),
    ("ключ", (0, 1, 2, 63, 63, 324, 7347)),
])
def test_pinned_vectors(key: str, shards: tuple[int, ...]) -> None:
    assert tuple(shard_for_key(key, n) for n in COUNTS) == shards
    assert shard_for_key(key.encode(), 64) == shards[3]


def test_growing_by_one_shard_moves_only_the_keys_of_the_new_shard() -> None:
    keys = [f"key-{i}" for i in range(20_000)]
    for n in (1, 7, 64):
        moved = [k for k in keys if shard_for_key(k, n) != shard_for_key(k, n + 1)]
        assert all(shard_for_key(k, n + 1) == n for k in moved)
        # About 1 / (n + 1) of them: between half and twice that.
        assert len(keys) / (n + 1) / 2 < len(moved) < 2 * len(keys) / (n + 1)


def test_shrinking_moves_only_the_keys_of_the_shards_removed() -> None:
    for i in range(5_000):
        h = key_hash(f"k{i}")
        if jump(h, 64) < 48:
            assert jump(h, 48) == jump(h, 64)


def test_every_shard_gets_keys_and_bad_counts_are_refused() -> None:
    assert {shard_for_key(f"k{i}", 8) for i in range(200)} == set(range(8))
    with pytest.raises(ValueError):
        shard_for_key("k", 0)
