"""`Observed` keeps, for each record, the version this node saw and since
when on its own monotonic clock: a version seen again keeps its time, a new
version (or going missing, or coming back) starts it anew."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from shardlease.observed import MISSING, Observed, Seen

# (what happens, the versions seen at times 0, 1, 2, ..., what see() answers
# each time, and the `since` at the end)
SEQUENCES = [
    ("a record seen once is new", ["v1"], [True], 0.0),
    ("the same version seen again is unchanged and keeps its time",
     ["v1", "v1", "v1"], [True, False, False], 0.0),
    ("a new version starts the time anew", ["v1", "v1", "v2"], [True, False, True], 2.0),
    ("a record that goes missing changed", ["v1", MISSING], [True, True], 1.0),
    ("a record missing for a while is unchanged while it stays missing",
     [MISSING, MISSING, MISSING], [True, False, False], 0.0),
    ("a record that comes back after missing changed", [MISSING, MISSING, "v1"],
     [True, False, True], 2.0),
    ("a version seen before, then another, then the first again, is new again",
     ["v1", "v2", "v1"], [True, True, True], 2.0),
]


@pytest.mark.parametrize(("what", "versions", "answers", "since"), SEQUENCES,
                         ids=[s[0] for s in SEQUENCES])
def test_see_answers_whether_the_version_is_new_and_keeps_the_first_time_it_was_seen(
        what: str, versions: list[str], answers: list[bool], since: float) -> None:
    observed: Observed[str, None] = Observed()
    got = [observed.see("k", version, float(t)) for t, version in enumerate(versions)]
    assert got == answers
    seen = observed.get("k")
    assert seen is not None
    assert (seen.version, seen.since) == (versions[-1], since)
    assert observed.unchanged_for("k", 10.0) == 10.0 - since


def test_missing_is_seeing_the_missing_version() -> None:
    observed: Observed[str, None] = Observed()
    assert observed.missing("k", 1.0)
    assert not observed.missing("k", 2.0)
    assert observed.get("k") == Seen(MISSING, 1.0)
    assert not observed.see("k", MISSING, 3.0)


def test_an_unchanged_version_keeps_the_record_first_seen_with_it() -> None:
    observed: Observed[str, dict[str, int]] = Observed()
    observed.see("k", "v1", 0.0, {"n": 1})
    observed.see("k", "v1", 1.0, {"n": 2})
    assert observed.get("k") == Seen("v1", 0.0, {"n": 1})
    observed.see("k", "v2", 2.0, {"n": 3})
    assert observed.get("k") == Seen("v2", 2.0, {"n": 3})


@pytest.mark.parametrize(("what", "call"), [
    ("get", lambda o: o.get("never")),
    ("unchanged_for", lambda o: o.unchanged_for("never", 5.0)),
])
def test_a_key_never_seen_has_nothing(
        what: str, call: Callable[[Observed[str, None]], object]) -> None:
    observed: Observed[str, None] = Observed()
    assert call(observed) is None
    assert "never" not in observed
    assert len(observed) == 0


def test_a_forgotten_key_is_new_when_seen_again() -> None:
    observed: Observed[str, None] = Observed()
    observed.see("k", "v1", 0.0)
    observed.forget("k")
    observed.forget("k")  # twice: no error
    assert "k" not in observed
    assert observed.unchanged_for("k", 1.0) is None
    assert observed.see("k", "v1", 5.0)
    assert observed.unchanged_for("k", 6.0) == 1.0


# (keys seen, keys kept, what remains: in the order first seen)
FORGET_EXCEPT = [
    (["a", "b", "c"], {"b"}, ["b"]),
    (["a", "b", "c"], {"a", "c", "z"}, ["a", "c"]),
    (["a", "b"], set(), []),
    (["c", "a", "b"], {"a", "b", "c"}, ["c", "a", "b"]),
]


@pytest.mark.parametrize(("seen", "kept", "left"), FORGET_EXCEPT)
def test_forget_except_keeps_only_the_keys_named_in_the_order_first_seen(
        seen: list[str], kept: set[str], left: list[str]) -> None:
    observed: Observed[str, None] = Observed()
    for key in seen:
        observed.see(key, "v", 0.0)
    observed.forget_except(kept)
    assert list(observed.keys()) == left
    assert [key for key, _ in observed.items()] == left
    assert len(observed) == len(left)
    assert all(key in observed for key in left)


def test_keys_may_be_tuples_as_epochs_are() -> None:
    observed: Observed[tuple[str, str], None] = Observed()
    observed.see(("node-0", "e1"), "3", 0.0)
    observed.missing(("node-1", "e2"), 0.5)
    assert dict(observed.items()) == {("node-0", "e1"): Seen("3", 0.0),
                                      ("node-1", "e2"): Seen(MISSING, 0.5)}


def test_a_seen_record_cannot_be_changed_in_place() -> None:
    seen: Seen[None] = Seen("v1", 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.since = 1.0  # type: ignore[misc]
