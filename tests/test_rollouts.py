"""The moves of a rollout, counted from the bodies of a StatefulSet and its
ShardSet (shardlease.k8s.rollouts): tables of cases."""

from __future__ import annotations

from typing import Any

import pytest

from shardlease.k8s.rollouts import Rollout, Tracking, count_moves, progress, step

T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"


def sts(update: str = "r2", current: str = "r1", *, replicas: int = 3, updated: int = 1,
        ready: int = 3, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"updateRevision": update, "currentRevision": current,
                       "updatedReplicas": updated, "readyReplicas": ready,
                       "observedGeneration": observed}}


def done(revision: str = "r2") -> dict[str, Any]:
    return sts(revision, revision, updated=3)


T2 = "2026-12-01T10:05:02Z"


def shardset(owners: dict[str, str], *, balanced: bool = True, live: int = 3,
             record: dict[str, Any] | None = None, published: str = T0) -> dict[str, Any]:
    status: dict[str, Any] = {"owners": owners, "liveNodes": live, "observedTime": published,
                              "conditions": [
        {"type": "Balanced", "status": "True" if balanced else "False"}]}
    if record is not None:
        status["lastRollout"] = record
    return {"status": status}


@pytest.mark.parametrize(("body", "revision", "rolling", "settled"), [
    (sts(), "r2", True, False),
    (done(), "r2", False, True),
    (sts("r2", "r2", updated=2), "r2", False, False),
    (sts("r2", "r2", updated=3, ready=2), "r2", False, False),
    ({**done(), "metadata": {"generation": 3}}, "r2", False, False),
    ({"spec": {"replicas": 3}, "status": {}}, None, False, False),
], ids=[
    "an update revision that is not the current one is a rollout",
    "every replica updated and Ready, one revision: settled",
    "one revision but a pod not created yet (a scale-up): no rollout, not settled",
    "one revision but a pod not Ready: not settled",
    "a spec the controller has not seen yet: not settled",
    "no revision in the status yet (just created): nothing",
])
def test_progress(body: dict[str, Any], revision: str | None, rolling: bool,
                  settled: bool) -> None:
    p = progress(body)
    assert (p.revision, p.rolling, p.settled) == (revision, rolling, settled)


@pytest.mark.parametrize(("last", "owners", "moves", "after"), [
    ({"0": "a", "1": "b"}, {"0": "a", "1": "b"}, 0, {"0": "a", "1": "b"}),
    ({"0": "a", "1": "b"}, {"0": "b", "1": "b"}, 1, {"0": "b", "1": "b"}),
    ({"0": "a", "1": "b"}, {"1": "b"}, 0, {"0": "a", "1": "b"}),
    ({"0": "a"}, {"0": "a", "1": "c"}, 0, {"0": "a", "1": "c"}),
    ({"0": "a", "1": "a"}, {"0": "b", "1": "c"}, 2, {"0": "b", "1": "c"}),
], ids=[
    "the same owners: no move",
    "a shard on another pod: one move",
    "a shard unowned keeps its last owner, no move",
    "a shard seen owned for the first time: no move",
    "two shards moved: two moves",
])
def test_count_moves(last: dict[str, str], owners: dict[str, str], moves: int,
                     after: dict[str, str]) -> None:
    assert count_moves(last, owners) == (moves, after)


def test_a_rollout_counts_the_moves_from_its_start_to_balanced_after_the_last_pod() -> None:
    tracking, record = step(None, sts(), shardset({"0": "a", "1": "b", "2": "c"}), T0)
    assert record == Rollout(revision="r2", started_at=T0, moves=0)
    assert tracking is not None
    # c stops: its shard goes to a; then unowned for a while; then back on c.
    tracking, record = step(tracking, sts(), shardset({"0": "a", "1": "b", "2": "a"},
                                                     record=record.wire()), T0)
    assert record is not None and record.moves == 1
    wire = record.wire()
    tracking, record = step(tracking, sts(), shardset({"0": "a", "1": "b"}, record=wire), T0)
    assert record is None  # unowned: no move, nothing new to write
    tracking, record = step(tracking, sts(), shardset({"0": "a", "1": "b", "2": "c"},
                                                     record=wire), T0)
    assert record is not None and record.moves == 2
    wire = record.wire()
    # The StatefulSet is done but the shards are not balanced yet: still counting.
    tracking, record = step(tracking, done(), shardset({"0": "a", "1": "b", "2": "c"},
                                                      balanced=False, record=wire), T1)
    assert tracking is not None and record is None
    # Balanced, but over 2 live pods: the last one back is not seen live yet.
    tracking, record = step(tracking, done(), shardset({"0": "a", "1": "b", "2": "c"},
                                                      live=2, record=wire), T1)
    assert tracking is not None and record is None
    # Balanced over all three, but published before the StatefulSet was seen
    # settled (T1): it may predate the last pod's restart.
    tracking, record = step(tracking, done(), shardset({"0": "a", "1": "b", "2": "c"},
                                                      record=wire, published=T1), T1)
    assert tracking is not None and record is None
    tracking, record = step(tracking, done(), shardset({"0": "a", "1": "b", "2": "c"},
                                                      record=wire, published=T2), T2)
    assert tracking is None
    assert record == Rollout(revision="r2", started_at=T0, finished_at=T2, moves=2)
    # Written: nothing more to do until the next rollout.
    assert step(None, done(), shardset({"0": "a"}, record=record.wire()), T2) == (None, None)


def test_a_leader_picks_up_an_unfinished_record_and_goes_on_from_the_owners_it_sees() -> None:
    written = Rollout(revision="r2", started_at=T0, moves=5).wire()
    tracking, record = step(None, sts(), shardset({"0": "a"}, record=written), T1)
    assert tracking is not None and tracking.record.moves == 5 and record is None
    tracking, record = step(tracking, sts(), shardset({"0": "b"}, record=written), T1)
    assert record is not None and (record.moves, record.started_at) == (6, T0)


def test_a_new_revision_before_the_last_ended_starts_a_new_count() -> None:
    tracking = Tracking(record=Rollout(revision="r2", started_at=T0, moves=3), last={"0": "a"})
    tracking, record = step(tracking, sts("r3", "r1"), shardset({"0": "b"}), T1)
    assert record == Rollout(revision="r3", started_at=T1, moves=0)


def test_no_rollout_no_record_and_nothing_to_write() -> None:
    assert step(None, done("r1"), shardset({"0": "a"}), T0) == (None, None)
    assert step(None, sts("r1", "r1", updated=2), shardset({"0": "a"}), T0) == (None, None)


@pytest.mark.parametrize("raw", [None, "garbage", {"revision": ""}, {"moves": -1},
                                 {"revision": "r2", "startedAt": T0, "moves": "many"}])
def test_an_unreadable_record_is_no_record(raw: object) -> None:
    assert Rollout.parse(raw) is None
    # ...and a rollout starts a new one over it.
    _, record = step(None, sts(), shardset({"0": "a"}, record=raw), T0)  # type: ignore[arg-type]
    assert record == Rollout(revision="r2", started_at=T0, moves=0)


def test_a_record_another_leader_wrote_meanwhile_wins_over_this_ones_memory() -> None:
    # This replica led, counted 3 and wrote it; another led since and
    # finished the rollout with 7 moves. Leading again, this one keeps that.
    mine = Rollout(revision="r2", started_at=T0, moves=3)
    tracking = Tracking(record=mine, last={"0": "a"}, wrote=mine)
    theirs = Rollout(revision="r2", started_at=T0, finished_at=T1, moves=7)
    assert step(tracking, done(), shardset({"0": "b"}, record=theirs.wire(),
                                           published=T2), T2) == (None, None)
    # Its own write, not yet seen back (the status still shows the one
    # before), is no other leader's.
    newer = Rollout(revision="r2", started_at=T0, moves=4)
    tracking = Tracking(record=newer, last={"0": "a"}, wrote=mine)
    _, record = step(tracking, sts(), shardset({"0": "b"}, record=mine.wire()), T1)
    assert record is not None and record.moves == 5
