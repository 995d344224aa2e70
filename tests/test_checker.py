"""The overlap checker over recorded events, and the recording host feeding it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from shardlease.checker import check_events, load_events, tenures
from shardlease.cli import record_deadlines
from shardlease.hosts.record import RecordHost
from shardlease.loop import PlacementLoop
from shardlease.options import Options
from shardlease.stores.memory import MemoryBackend, MemoryStore


def ev(event: str, node: str, wall: float, shard: int = 0, generation: int = 1,
       deadline: float | None = None, pid: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"event": event, "node": node, "pid": pid or hash(node) % 10000,
                           "wall": wall, "shard": shard, "generation": generation}
    if deadline is not None:
        out["deadline_wall"] = deadline
    return out


def tenure(node: str, generation: int, start: float, end: float | None, deadline: float,
           shard: int = 0) -> list[dict[str, Any]]:
    """Host calls of one open; `end` None: the node died without closing."""
    out = [ev("open_start", node, start, shard, generation, deadline),
           ev("open_end", node, start + 0.01, shard, generation)]
    if end is not None:
        out += [ev("close_start", node, end, shard, generation),
                ev("close_end", node, end + 0.01, shard, generation)]
    return out


def test_a_clean_handoff_passes() -> None:
    events = tenure("a", 1, 10.0, 20.0, 25.0) + tenure("b", 2, 21.0, None, 30.0)
    report = check_events(events)
    assert report.ok, report.violations
    assert report.tenures == 2 and report.shards == 1


def test_an_open_on_two_nodes_with_a_valid_deadline_fails() -> None:
    events = tenure("a", 1, 10.0, 30.0, 40.0) + tenure("b", 2, 20.0, None, 50.0)
    report = check_events(events)
    assert not report.ok
    assert "shard 0" in report.violations[0] and "still open" in report.violations[0]


def test_a_killed_owner_whose_deadline_passed_excuses_the_overlap() -> None:
    # a never closes (kill -9); its deadline 15 passed before b opened at 20.
    events = tenure("a", 1, 10.0, None, 15.0) + tenure("b", 2, 20.0, None, 30.0)
    assert check_events(events).ok


def test_a_paused_owner_closing_late_after_its_deadline_passes() -> None:
    # SIGSTOP: a's deadline 15 passes while stopped, b opens at 20, a resumes
    # and closes at 25 (fenced): an overlap the deadline excuses.
    events = tenure("a", 1, 10.0, 25.0, 15.0) + tenure("b", 2, 20.0, None, 30.0)
    assert check_events(events).ok
    assert check_events(events, conservative=True).ok


def test_a_deadline_extended_during_the_overlap_fails() -> None:
    events = tenure("a", 1, 10.0, None, 15.0) + tenure("b", 2, 20.0, None, 30.0)
    events.append(ev("deadline", "a", 22.0, 0, 1, deadline=27.0))
    report = check_events(events)
    assert not report.ok
    assert "wall 22.000" in report.violations[0]


def test_deadline_lines_move_the_deadline_of_their_own_tenure_only() -> None:
    events = tenure("a", 1, 10.0, None, 15.0) + tenure("b", 2, 20.0, None, 30.0)
    events.append(ev("deadline", "a", 12.0, 0, 1, deadline=18.0))
    events.append(ev("deadline", "a", 12.0, 1, 1, deadline=99.0))  # another shard
    assert check_events(events).ok
    events.append(ev("deadline", "a", 13.0, 0, 1, deadline=21.0))
    assert not check_events(events).ok


def test_no_recorded_deadline_counts_as_valid_forever() -> None:
    events = tenure("a", 1, 10.0, None, 0.0) + tenure("b", 2, 20.0, None, 30.0)
    del events[0]["deadline_wall"]
    report = check_events(events)
    assert not report.ok and "no deadline recorded" in report.violations[0]


def test_generations_must_strictly_increase_in_opening_order() -> None:
    events = tenure("a", 2, 10.0, 20.0, 25.0) + tenure("b", 2, 21.0, None, 30.0)
    report = check_events(events)
    assert any("strictly increase" in v for v in report.violations)
    events = tenure("a", 3, 10.0, 20.0, 25.0) + tenure("b", 2, 21.0, None, 30.0)
    assert any("strictly increase" in v for v in check_events(events).violations)


def test_the_conservative_window_counts_opening_and_closing_as_open() -> None:
    # b starts opening at 20.005, while a is between close_start 20.0 and
    # close_end 20.01, with its deadline still valid.
    events = tenure("a", 1, 10.0, 20.0, 25.0) + tenure("b", 2, 20.005, None, 30.0)
    assert check_events(events).ok
    assert not check_events(events, conservative=True).ok


def test_host_calls_out_of_order_are_reported() -> None:
    events = [ev("open_start", "a", 1.0, 0, 1, 9.0), ev("open_end", "a", 1.1, 0, 1),
              ev("open_start", "a", 2.0, 0, 2, 9.0)]
    report = check_events(events)
    assert any("called open_start after open_end" in v for v in report.violations)


def test_an_open_cut_short_by_a_fence_is_in_order() -> None:
    events = [ev("open_start", "a", 1.0, 0, 1, 9.0), ev("close_start", "a", 2.0, 0, 1),
              ev("close_end", "a", 2.1, 0, 1)]
    report = check_events(events)
    assert report.ok
    assert tenures(events)[0].interval(conservative=False) is None
    assert tenures(events)[0].interval(conservative=True) == (1.0, 2.1)


def test_a_restarted_node_with_the_same_name_is_another_tenure() -> None:
    events = (tenure("a", 1, 10.0, None, 15.0)
              + [dict(e, pid=2) for e in tenure("a", 2, 20.0, None, 30.0)])
    report = check_events(events)
    assert report.ok and report.tenures == 2


def test_load_events_skips_torn_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in tenure("a", 1, 1.0, 2.0, 5.0)]
    path.write_text("\n".join(lines) + "\n\n" + '{"event": "open_st')
    assert len(load_events([path, tmp_path / "missing.jsonl"])) == 4


async def test_recorded_in_process_loops_pass_the_check(tmp_path: Path) -> None:
    """Two real loops on the memory store with recording hosts: a join, a
    release, a graceful stop; the recording has deadlines and passes."""
    backend = MemoryBackend()
    path = tmp_path / "events.jsonl"
    loops, tasks = [], []
    for name in ("a", "b"):
        options = Options.make(shards=6, lease_ttl=0.9, name=name, cluster_name="t")
        host = RecordHost(str(path), name)
        placement = PlacementLoop(MemoryStore(backend, name="t"), host, options)
        placement.telemetry.subscribe(host.on_event)
        record_deadlines(placement, host)
        loops.append(placement)
        tasks.append(asyncio.create_task(placement.run()))
        await asyncio.sleep(0.8)
    await asyncio.sleep(1.0)
    assert sorted(len(p.open_shards()) for p in loops) == [3, 3]
    for placement in loops:
        await placement.stop()
    await asyncio.gather(*tasks)

    events = load_events([path])
    kinds = {e["event"] for e in events}
    assert {"open_start", "open_end", "close_start", "close_end", "deadline", "opened",
            "claim", "release", "closed"} <= kinds
    report = check_events(events, conservative=True)
    assert report.ok, report.violations
    assert report.shards == 6 and report.tenures > 6  # b's join moved some shards
