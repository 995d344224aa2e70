"""The slow-store figures of `shardlease bench` (and of the process test), from
recorded lines: what a node held, fenced and lost in a phase, and the longest
a shard was open nowhere."""

from __future__ import annotations

from collections import Counter
from typing import Any

from shardlease_tools.bench import closed_stretches, open_on, phase_figures


def ev(wall: float, node: str, event: str, **fields: Any) -> dict[str, Any]:
    return {"wall": wall, "node": node, "event": event, **fields}


RECORDED = [
    ev(1, "a", "open_end", shard=0), ev(1, "a", "open_end", shard=1),
    ev(2, "b", "open_end", shard=2),
    # In the phase [10, 20]: a fences shard 0 and 1, b takes shard 0 back at 16.
    ev(12, "a", "self_fence", shards=[0, 1]),
    ev(12, "a", "close_start", shard=0), ev(12, "a", "close_start", shard=1),
    ev(16, "b", "open_end", shard=0),
    ev(18, "a", "lost", shard=1),
    ev(19, "a", "open_end", shard=3),  # open nowhere before
    ev(25, "a", "open_end", shard=1),
]
LOGGED = [{"ts": 11.0, "event": "renew_slow"}, {"ts": 12.0, "event": "renew_failed",
                                                  "error": "no answer"},
          {"ts": 21.0, "event": "renew_slow"}]


def test_a_phase_counts_what_the_node_held_fenced_and_lost() -> None:
    f = phase_figures("p", "a", 10.0, 20.0, RECORDED, LOGGED, Counter(put=3))
    assert (f.held_start, f.held_min, f.held_max, f.held_end) == (2, 0, 2, 1)
    assert (f.self_fences, f.fenced, f.lost) == (1, 2, 1)
    assert (f.renew_slow, f.renew_failed, f.errors) == (1, 1, ["no answer"])
    assert f.closed_max == 9.0  # shard 3: open nowhere from the start of the phase to 19
    assert f.closed_area == 4 + 8 + 9  # shard 0 (12 to 16), 1 (12 to 20), 3 (10 to 19)
    assert "self-fences  1 (2 shards)" in f.row()


def test_the_longest_closed_stretch_is_clipped_to_the_phase() -> None:
    known = [e for e in RECORDED if e.get("shard") != 3]
    assert closed_stretches(known, 10.0, 15.0) == (3.0, 6.0)  # shards 0 and 1, 12 to 15
    assert closed_stretches(known, 10.0, 20.0) == (8.0, 12.0)  # shard 1, 12 to the end
    assert closed_stretches(known, 0.0, 10.0) == (2.0, 4.0)  # shard 2 until 2; 0, 1 until 1
    assert closed_stretches(known, 13.0, 30.0) == (12.0, 15.0)  # 1: 13 to 25; 0: 13 to 16
    assert closed_stretches(RECORDED, 13.0, 30.0) == (12.0, 21.0)  # and 3: 13 to 19


def test_open_on_is_what_a_nodes_host_has_open_at_the_end() -> None:
    assert open_on(RECORDED, "a") == {1, 3}
    assert open_on(RECORDED, "b") == {0, 2}
    assert open_on(RECORDED, "c") == set()
