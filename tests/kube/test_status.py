"""The ShardSet status says who owns what and whether the shares are fair."""

import pytest

from shardlease.k8s.status import (
    build_status,
    comparable,
    highest,
    merge_conditions,
    published_generations,
)
from shardlease.loop import Owner


def owners(mapping: dict[int, str | None]) -> list[Owner]:
    return [Owner(s, o, 3 if o else 0) for s, o in mapping.items()]


def cond(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_fair_and_complete_ownership_is_balanced() -> None:
    st = build_status(owners({0: "a", 1: "b", 2: "a", 3: "b"}), ["a", "b"], 4, 7, "a")
    assert st["owners"] == {"0": "a", "1": "b", "2": "a", "3": "b"}
    assert st["generations"] == {"0": 3, "1": 3, "2": 3, "3": 3}
    assert (st["ownedShards"], st["liveNodes"], st["nodes"]) == (4, 2, ["a", "b"])
    assert st["observedGeneration"] == 7
    assert cond(st, "Balanced")["status"] == "True"
    assert cond(st, "Degraded")["status"] == "False"


def test_unowned_shards_are_absent_from_owners_and_degrade_the_set() -> None:
    st = build_status(owners({0: "a", 1: None, 2: "a"}), ["a"], 3, None, "a")
    assert st["owners"] == {"0": "a", "2": "a"}
    assert "1" not in st["generations"]
    assert cond(st, "Balanced")["reason"] == "UnownedShards"
    assert cond(st, "Degraded")["status"] == "True"


def test_a_node_above_its_fair_share_is_not_balanced() -> None:
    st = build_status(owners({0: "a", 1: "a", 2: "a", 3: "b"}), ["a", "b"], 4, None, "a")
    assert cond(st, "Balanced")["status"] == "False"
    assert cond(st, "Balanced")["reason"] == "OverShare"
    assert "a holds 3" in cond(st, "Balanced")["message"]


def test_transition_times_move_only_when_a_condition_flips() -> None:
    old = [{"type": "Balanced", "status": "True", "lastTransitionTime": "T0"},
           {"type": "Configured", "status": "True", "lastTransitionTime": "T1"}]
    same = merge_conditions([{"type": "Balanced", "status": "True"}], old, 2)
    assert same[0]["lastTransitionTime"] == "T0"
    assert same[0]["observedGeneration"] == 2
    assert {"type": "Configured", "status": "True", "lastTransitionTime": "T1"} in same
    flipped = merge_conditions([{"type": "Balanced", "status": "False"}], old, 2)
    assert flipped[0]["lastTransitionTime"] != "T0"


def test_comparable_ignores_transition_times() -> None:
    a = build_status(owners({0: "a"}), ["a"], 1, 1, "a")
    b = build_status(owners({0: "a"}), ["a"], 1, 1, "a")
    a["conditions"] = merge_conditions(a["conditions"], None, 1)
    assert comparable(a) != comparable(b)  # observedGeneration on conditions
    b["conditions"] = merge_conditions(b["conditions"], None, 1)
    assert comparable(a) == comparable(b)


def test_a_status_is_stale_after_six_intervals_without_a_refresh() -> None:
    import datetime as dt

    from shardlease.k8s.status import interval_of, stale_for

    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
    assert interval_of({"leaseTTL": 15}) == 5.0
    assert interval_of({"leaseTTL": 15, "interval": 2}) == 2.0
    assert stale_for({"observedTime": "2026-11-30T11:59:31Z"}, 5.0, now) is None  # 29 s
    assert stale_for({"observedTime": "2026-11-30T11:59:00Z"}, 5.0, now) == 60.0
    assert stale_for({}, 5.0, now) is None  # from an agent that predates observedTime
    assert stale_for({"observedTime": "yesterday"}, 5.0, now) is None
    st = build_status(owners({0: "a"}), ["a"], 1, 1, "a")
    assert "observedTime" in st and "observedTime" not in comparable(st)


@pytest.mark.parametrize(("status", "expected"), [
    ({"generations": {"0": 3, "1": 1}}, {0: 3, 1: 1}),
    ({"generations": {"0": 3}, "highestGenerations": {"0": 5, "2": 4}}, {0: 5, 2: 4}),
    ({"generations": {"0": 6}, "highestGenerations": {"0": 5}}, {0: 6}),
    # Whatever else a status holds is left out, never an error.
    ({"highestGenerations": {"x": 3, "-1": 3, "1": "7", "2": 0, "3": -2, "4": True,
                             "5": 2.5, "6": None, "7": 9}}, {7: 9}),
    ({"highestGenerations": ["0", 3]}, {}),
    # Above 2^53 - 1 (issue 38): would push every claim past what readers
    # keep exactly; ignored (and reported), the shard's others kept.
    ({"generations": {"0": 3}, "highestGenerations": {"0": 2**53, "1": 2**53 - 1}},
     {0: 3, 1: 2**53 - 1}),
    ({"generations": None}, {}),
    ({}, {}),
    (None, {}),
])
def test_the_generations_a_status_publishes(status: dict | None, expected: dict) -> None:
    assert published_generations(status) == expected


def test_highest_is_the_max_per_shard() -> None:
    assert highest({0: 1, 1: 5}, {0: 3}, {}, {2: 2}) == {0: 3, 1: 5, 2: 2}
    assert highest() == {}


def test_the_status_publishes_the_highest_generation_of_every_shard_owned_or_not() -> None:
    st = build_status(
        [Owner(0, "a", 4), Owner(1, None, 0), Owner(2, "b", 1)], ["a", "b"], 3, None, "a",
        highest_generations={0: 2, 1: 7, 2: 3, 9: 5})  # shard 9: beyond `shards`
    assert st["generations"] == {"0": 4, "2": 1}
    assert st["highestGenerations"] == {"0": 4, "1": 7, "2": 3}
    assert build_status([Owner(0, "a", 4)], ["a"], 1, None, "a")["highestGenerations"] \
        == {"0": 4}
