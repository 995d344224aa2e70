"""The overlap checker: did two nodes ever have one shard open at once?

A pure function over the events a recording host wrote (`hosts/record.py`,
one JSON object per line). The safety rule it checks is the design's: no shard
is ever open on two nodes at once *unless the older owner's deadline had
passed* (a node paused beyond its deadline is fenced by the generation, not by
time). It also checks that generations strictly increase per shard, in the
order shards were opened, and that each node process called its host in order
(a close always follows the open it closes, never two opens in a row).

Events the checker reads (others are ignored), each with `node`, `pid`,
`shard`, `generation` and `wall` (time.time() when it happened):

- `open_start`, `open_end`, `close_start`, `close_end`: the host calls;
- `open_start` and `opened` may carry `deadline_wall`, and `deadline` lines
  carry it whenever a renewal moved the runner's deadline.

A *tenure* is one node process holding one shard at one generation. Its open
interval runs from `open_end` to `close_start` (the default, as the host sees
the shard open), or with `conservative=True` from `open_start` to `close_end`
(any moment the host might have been touching it). A tenure with no close
(a killed node) stays open forever: only its deadline can excuse an overlap.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST_CALLS = ("open_start", "open_end", "close_start", "close_end")


@dataclass
class Tenure:
    """One node process's hold on one shard at one generation."""

    node: str
    pid: int
    shard: int
    generation: int
    open_start: float | None = None
    open_end: float | None = None
    close_start: float | None = None
    close_end: float | None = None
    #: (wall time the deadline became known, the deadline in wall time), sorted.
    deadlines: list[tuple[float, float]] = field(default_factory=list)

    def interval(self, conservative: bool) -> tuple[float, float] | None:
        """When the shard counts as open here, or None if it never was."""
        if conservative:
            start, end = self.open_start, self.close_end
        else:
            start, end = self.open_end, self.close_start
        if start is None:
            return None
        return start, math.inf if end is None else end

    def deadline_at(self, t: float) -> float:
        """The deadline in force at wall time `t` (inf if none known yet)."""
        current = math.inf
        for since, deadline in self.deadlines:
            if since > t:
                break
            current = deadline
        return current

    def describe(self) -> str:
        return f"{self.node}[pid {self.pid}] generation {self.generation}"


@dataclass(frozen=True, kw_only=True)
class Report:
    """What the checker found. `ok` when there are no violations."""

    violations: tuple[str, ...]
    tenures: int
    shards: int
    events: int

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        verdict = "PASS" if self.ok else f"FAIL ({len(self.violations)} violation(s))"
        return (f"{verdict}: {self.tenures} open(s) of {self.shards} shard(s) over "
                f"{self.events} recorded event(s)")


def load_events(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Read recorded JSON lines from files (missing files give nothing). A torn
    last line (a writer killed mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(item, dict):
                events.append(item)
    return events


def tenures(events: Iterable[Mapping[str, Any]]) -> list[Tenure]:
    """Group host calls and deadlines into tenures, in the order they began."""
    found: dict[tuple[str, int, int, int], Tenure] = {}
    for ev in sorted(events, key=lambda e: float(e.get("wall", 0.0))):
        kind = ev.get("event")
        if kind not in (*HOST_CALLS, "opened", "deadline"):
            continue
        try:
            key = (str(ev["node"]), int(ev["pid"]), int(ev["shard"]), int(ev["generation"]))
            wall = float(ev["wall"])
        except (KeyError, TypeError, ValueError):
            continue
        tenure = found.get(key)
        if tenure is None:
            tenure = found[key] = Tenure(*key)
        if kind in HOST_CALLS and getattr(tenure, kind) is None:
            setattr(tenure, kind, wall)
        deadline = ev.get("deadline_wall")
        if isinstance(deadline, int | float):
            tenure.deadlines.append((wall, float(deadline)))
    for tenure in found.values():
        tenure.deadlines.sort()
    return sorted(found.values(),
                  key=lambda t: (t.open_start if t.open_start is not None else math.inf,
                                 t.generation))


def _call_order(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Each node process's host calls per shard must go open, open end, close,
    close end, open... (an open cut short by a fence may lack its end)."""
    allowed = {
        None: {"open_start"},
        "open_start": {"open_end", "close_start"},
        "open_end": {"close_start"},
        "close_start": {"close_end"},
        "close_end": {"open_start"},
    }
    last: dict[tuple[str, int, int], str | None] = defaultdict(lambda: None)
    problems = []
    calls = [e for e in events if e.get("event") in HOST_CALLS]
    for ev in sorted(calls, key=lambda e: float(e.get("wall", 0.0))):
        try:
            key = (str(ev["node"]), int(ev["pid"]), int(ev["shard"]))
        except (KeyError, TypeError, ValueError):
            continue
        kind = str(ev["event"])
        if kind not in allowed[last[key]]:
            problems.append(f"shard {key[2]}: {key[0]}[pid {key[1]}] called {kind} "
                            f"after {last[key] or 'nothing'}")
        last[key] = kind
    return problems


def _overlap(older: Tenure, newer: Tenure, conservative: bool) -> str | None:
    """A violation if `newer` was open while `older` was still open with a
    deadline that had not passed; None if the two are safe."""
    a, b = older.interval(conservative), newer.interval(conservative)
    if a is None or b is None:
        return None
    start, end = max(a[0], b[0]), min(a[1], b[1])
    if start >= end:
        return None
    # The older owner's deadline only changes at its recorded deadlines; check
    # the start of the overlap and every change inside it.
    moments = [start] + [since for since, _ in older.deadlines if start < since < end]
    for t in moments:
        deadline = older.deadline_at(t)
        if deadline > t:
            when = "no deadline recorded" if math.isinf(deadline) else \
                f"its deadline {deadline - t:.3f}s away"
            return (f"shard {older.shard}: {newer.describe()} open at wall {t:.3f} while "
                    f"{older.describe()} was still open with {when}")
    return None


def check_events(events: Iterable[Mapping[str, Any]], *, conservative: bool = False) -> Report:
    """Check recorded events for the safety rules (see the module docstring)."""
    events = list(events)
    found = tenures(events)
    violations: list[str] = []
    by_shard: dict[int, list[Tenure]] = defaultdict(list)
    for tenure in found:
        if tenure.open_start is not None or tenure.open_end is not None:
            by_shard[tenure.shard].append(tenure)
    for shard, held in sorted(by_shard.items()):
        previous: Tenure | None = None
        for tenure in held:  # in the order their opens started
            if previous is not None and tenure.generation <= previous.generation:
                violations.append(
                    f"shard {shard}: {tenure.describe()} opened after "
                    f"{previous.describe()}: generations must strictly increase")
            previous = tenure
        for i, older in enumerate(held):
            for newer in held[i + 1:]:
                first, second = sorted((older, newer), key=lambda t: t.generation)
                problem = _overlap(first, second, conservative)
                if problem is not None:
                    violations.append(problem)
    violations.extend(_call_order(events))
    return Report(violations=tuple(violations), tenures=sum(map(len, by_shard.values())),
                  shards=len(by_shard), events=len(events))
