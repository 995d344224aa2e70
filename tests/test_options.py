"""Options validation: invalid combinations are refused with a clear message."""

from __future__ import annotations

import pytest

from shardlease.errors import ConfigError
from shardlease.options import Options
from shardlease.records import MAX_LEASE_TTL


def test_defaults_follow_the_seed() -> None:
    o = Options(shards=8, name="n")
    assert (o.lease_ttl, o.interval_s, o.margin_s, o.max_concurrency) == (15.0, 5.0, 2.5, 16)
    # Not the seed's: node-epoch renewal, whose store traffic does not grow
    # with the shards (docs/renewal.md).
    assert o.renewal == "node"


def test_explicit_interval_and_margin() -> None:
    o = Options(shards=1, name="n", lease_ttl=30, interval=4, margin=6)
    assert (o.interval_s, o.margin_s) == (4, 6)


def test_margin_not_below_the_ttl_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        Options.make(shards=4, name="n", lease_ttl=10, margin=10)
    assert "margin (10s) must be less than lease_ttl (10s)" in str(e.value)


def test_no_margin_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        Options.make(shards=4, name="n", lease_ttl=10, margin=0)
    assert "margin must be above 0s" in str(e.value)


@pytest.mark.parametrize(("open_timeout", "close_timeout"), [(0.001, 0.001), (3600, 3600)])
def test_any_open_and_close_timeouts_fit_the_margin(open_timeout: float,
                                                    close_timeout: float) -> None:
    # A fence interrupts an open, and a fenced close is cut at the margin:
    # neither timeout can make a shard outlive its lease, so none is refused.
    o = Options.make(shards=4, name="n", lease_ttl=10, open_timeout=open_timeout,
                     close_timeout=close_timeout)
    assert (o.open_timeout, o.close_timeout) == (open_timeout, close_timeout)


def test_interval_not_below_ttl_minus_margin_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        Options.make(shards=4, name="n", lease_ttl=15, interval=12.5)
    assert "interval (12.5s) must be less than lease_ttl - margin (12.5s)" in str(e.value)


@pytest.mark.parametrize("shards", [0, -3])
def test_fewer_than_one_shard_is_refused(shards: int) -> None:
    with pytest.raises(ConfigError) as e:
        Options.make(shards=shards, name="n")
    message = str(e.value)
    assert message.startswith("invalid option shards:")
    assert "greater than or equal to 1" in message


def test_every_problem_is_reported_on_one_line_each() -> None:
    with pytest.raises(ConfigError) as e:
        Options.make(shards=0, name="n", max_concurrency=0)
    parts = str(e.value).split("; ")
    assert [p.split(":")[0] for p in parts] == ["invalid option shards",
                                                 "invalid option max_concurrency"]


def test_options_are_a_config_error_and_a_value_error() -> None:
    with pytest.raises(ValueError):
        Options.make(shards=0, name="n")


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ConfigError) as e:
        Options.make(shards=1, name="n", lease_tll=3)
    assert "lease_tll" in str(e.value)


def test_a_lease_ttl_above_what_readers_accept_is_refused() -> None:
    # Readers treat a record claiming a longer TTL as corrupt (a huge one
    # would pin a shard forever), so no node may write one.
    Options.make(shards=1, name="n", lease_ttl=MAX_LEASE_TTL)
    with pytest.raises(ConfigError, match="lease_ttl"):
        Options.make(shards=1, name="n", lease_ttl=MAX_LEASE_TTL + 1)
