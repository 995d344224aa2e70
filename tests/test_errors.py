"""The error hierarchy says what a caller must handle: one clause for the
domain, and no branch that swallows an answer (Conflict) or bad data
(CorruptRecord) as if it were a transient store failure."""

from __future__ import annotations

import pytest

import shardlease
from shardlease.errors import (
    ConfigError,
    Conflict,
    CorruptRecord,
    EngineError,
    HostError,
    RunnerDied,
    ShardleaseError,
    StoreError,
    StoreUnsafe,
)

LEAVES = [ConfigError, StoreError, StoreUnsafe, Conflict, CorruptRecord, HostError,
          EngineError, RunnerDied]


@pytest.mark.parametrize("error", LEAVES)
def test_one_clause_catches_every_error_shardlease_raises(error: type[Exception]) -> None:
    with pytest.raises(ShardleaseError):
        raise error("boom")


@pytest.mark.parametrize("error", [Conflict, CorruptRecord])
def test_a_store_error_clause_catches_neither_a_lost_race_nor_bad_data(
        error: type[Exception]) -> None:
    with pytest.raises(error):
        try:
            raise error("not transient")
        except StoreError:
            pytest.fail(f"`except StoreError` swallowed a {error.__name__}")


def test_a_store_error_clause_still_catches_an_unsafe_store() -> None:
    with pytest.raises(StoreError):
        raise StoreUnsafe("conditional writes ignored")


def test_a_dead_runner_is_an_engine_error_and_still_a_runtime_error() -> None:
    assert issubclass(RunnerDied, EngineError)
    assert issubclass(EngineError, RuntimeError)  # callers written before the hierarchy
    assert not issubclass(RunnerDied, StoreError | HostError)


def test_bad_data_and_bad_options_are_value_errors() -> None:
    assert issubclass(CorruptRecord, ValueError) and issubclass(ConfigError, ValueError)


def test_the_package_exports_the_whole_hierarchy() -> None:
    exported = {name for name in shardlease.__all__ if name[0].isupper()}
    assert {e.__name__ for e in LEAVES} | {"ShardleaseError"} <= exported
    for e in LEAVES:
        assert getattr(shardlease, e.__name__) is e
