"""What a person sees of the demo: a live grid while it runs, a timeline after.

Rendered with rich (the same renderables go to the terminal and, recorded,
to an SVG file). The demo feeds it owner snapshots and phase marks; this
module only draws.

- the grid: one row per node (state, lease count, its shards with their
  generations, in the node's colour), a row of free shards, the phase being
  run and, after a kill, a countdown to the victim's lease expiry;
- the timeline: one row per shard, time left to right, each cell coloured by
  its owner at that moment, the generation written where a new claim starts,
  and the kill / join / stop moments marked above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan",
           "bright_magenta", "bright_green", "bright_yellow")
FREE = "grey35"
#: Padding that SVG renderers keep (they collapse runs of plain spaces).
PAD = "\u00a0"


@dataclass(frozen=True)
class Snapshot:
    t: float  # seconds since the demo started
    owners: tuple[str | None, ...]
    generations: tuple[int, ...]


@dataclass(frozen=True)
class Mark:
    t: float
    label: str
    symbol: str  # one character drawn on the timeline


@dataclass
class DemoView:
    shards: int
    ttl: float
    nodes: list[str] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    phase: str = ""
    countdown_from: float | None = None  # when the victim's leases started to age

    def colour(self, owner: str | None) -> str:
        if owner is None:
            return FREE
        if owner not in self.nodes:
            self.nodes.append(owner)
        return PALETTE[self.nodes.index(owner) % len(PALETTE)]

    def record(self, t: float, owners: Sequence[str | None],
               generations: Sequence[int]) -> None:
        snap = Snapshot(t, tuple(owners), tuple(generations))
        if not self.snapshots or self.snapshots[-1].owners != snap.owners or \
                self.snapshots[-1].generations != snap.generations:
            self.snapshots.append(snap)

    def mark(self, t: float, label: str, symbol: str) -> None:
        self.marks.append(Mark(t, label, symbol))
        self.phase = label

    # -- the live grid ------------------------------------------------------------------

    def grid(self, now: float, states: dict[str, str]) -> Group:
        snap = self.snapshots[-1] if self.snapshots else None
        title = Text(f"shardlease demo: {len(states)} nodes, {self.shards} shards, "
                     f"lease TTL {self.ttl:g}s", style="bold")
        title.append(f"   t={now:5.1f}s", style="dim")
        phase = Text(f"▶ {self.phase}", style="bold yellow") if self.phase else Text("")
        countdown = Text("")
        if self.countdown_from is not None:
            left = self.ttl - (now - self.countdown_from)
            countdown = Text(f"⏱ leases expire in {left:4.1f}s" if left > 0
                             else "⏱ leases expired: the others may claim them",
                             style="bold red")
        table = Table(box=None, pad_edge=False, show_edge=False)
        table.add_column("NODE")
        table.add_column("STATE")
        table.add_column("LEASES", justify="right")
        table.add_column("SHARDS (generation)")
        for name, state in states.items():
            colour = self.colour(name)
            held = [(s, g) for s, (o, g) in enumerate(zip(snap.owners, snap.generations,
                                                          strict=True)) if o == name] \
                if snap else []
            cells = Text()
            for s, g in held:
                cells.append(f"{s}", style=f"bold {colour}")
                cells.append(f"({g}) ", style=colour)
            state_style = {"running": "green", "killed": "bold red"}.get(state, "dim")
            table.add_row(Text(name, style=f"bold {colour}"), Text(state, style=state_style),
                          str(len(held)), cells)
        free = [s for s, o in enumerate(snap.owners) if o is None] if snap else \
            list(range(self.shards))
        table.add_row(Text("(free)", style=FREE), "", str(len(free)),
                      Text(" ".join(map(str, free)), style=FREE))
        return Group(title, phase, countdown, table)

    # -- the timeline -------------------------------------------------------------------

    def timeline(self, width: int = 64) -> Group:
        """Shards as rows, time as columns."""
        if not self.snapshots:
            return Group(Text("(no owners were seen)"))
        end = max([self.snapshots[-1].t, *(m.t for m in self.marks)]) or 1.0
        step = end / width

        def at(t: float) -> Snapshot | None:
            found = None
            for snap in self.snapshots:
                if snap.t <= t:
                    found = snap
                else:
                    break
            return found

        header = Text(PAD * 6)
        cols = [PAD] * width
        for m in self.marks:
            cols[min(width - 1, int(m.t / step))] = m.symbol
        header.append("".join(cols), style="bold")
        rows = [Text("shard ", style="dim").append(
            f"time → ({end:.0f}s)", style="dim"), header]
        for shard in range(self.shards):
            line = Text(f"{shard:>5} ".replace(" ", PAD))
            previous: tuple[str | None, int] | None = None
            col = 0
            while col < width:
                snap = at((col + 0.5) * step)
                owner = snap.owners[shard] if snap else None
                gen = snap.generations[shard] if snap else 0
                here = (owner, gen)
                colour = self.colour(owner)
                if owner is not None and here != previous:
                    label = str(gen)[: width - col]
                    line.append(label, style=f"bold black on {colour}")
                    col += len(label)
                else:
                    line.append("█" if owner else "·", style=colour)
                    col += 1
                previous = here
            rows.append(line)
        legend = Text("\n")
        for name in self.nodes:
            legend.append("██", style=self.colour(name))
            legend.append(f" {name}" + PAD * 3)
        legend.append("·· free", style=FREE)
        keys = Text("\n")
        for m in self.marks:
            keys.append(f"{m.symbol}", style="bold")
            keys.append(f" {m.t:5.1f}s  ".replace(" ", PAD) + f"{m.label}\n")
        return Group(*rows, legend, keys)


def save_svg(renderable: Group, path: Path, title: str, width: int = 100) -> Path:
    """The renderable as an SVG picture (rich's terminal export)."""
    console = Console(record=True, width=width, file=open("/dev/null", "w"),
                      force_terminal=True, color_system="truecolor")
    console.print(renderable)
    console.file.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    console.save_svg(str(path), title=title)
    return path
