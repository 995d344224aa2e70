"""Explore: run swarm cases (`shardlease.sim.swarm`) until a time budget is
spent, and report every one that breaks an invariant.

    python -m shardlease.sim.explore [--seconds N] [--seed S] [--renewal shard|node|both]
                                     [--jobs J] [--runs R] [--first]
                                     [--kinds k1,k2 | --skip k1,k2]
    python -m shardlease.sim.explore --replay CASE_SEED [--renewal shard|node] [--tail N]
                                     [--kinds ... | --skip ...]   (as it was found)

Each case is drawn from its own seed (the run's `--seed` seeds the sequence
of case seeds), with plain `random.Random`, not hypothesis: a case seed
replays exactly, in any process (`--replay`). A line is printed for every
case with a violation: its seed, renewal mode, fault kinds, first
violation, and the command that replays it. At the end: runs, runs per
second, cases with violations, and the first one's text. The exit status is
1 if any violation was found, else 0.

`--renewal both` (the default) lets each case draw its mode; `--kinds`
gives every case faults of exactly those kinds (see `swarm.KINDS`: e.g.
`--kinds reconfigure_ttl,store_one`), `--skip` keeps kinds out of the
subsets drawn (e.g. a kind whose bug is known and being fixed, to look for
others); `--first` stops at the first violation; `--runs` caps the
number of cases (with a fixed `--seed` the same cases run in the same order).

Every case seed this ever finds goes into tests/sim/regressions.py (with
the renewal mode and what it exercises) once the bug is fixed, where the
suite replays it for good; until then into its PENDING list. The mutants
in tests/sim/mutants/ (patches that bring known bugs back) are each run
against this command by tests/sim/test_explore.py: the explorer must catch
every one within the budget its patch names.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import shardlease
from shardlease.records import Renewal
from shardlease.sim.swarm import KINDS, SwarmCase, case_for


@dataclass(frozen=True)
class Outcome:
    seed: int
    renewal: Renewal
    kinds: tuple[str, ...]
    violations: tuple[str, ...]
    seconds: float
    forced_kinds: tuple[str, ...] | None = None  # the --kinds it was drawn with
    skipped: tuple[str, ...] = ()  # the --skip it was drawn with

    @property
    def command(self) -> str:
        """The command that replays this case."""
        cmd = f"python -m shardlease.sim.explore --replay {self.seed} --renewal {self.renewal}"
        if self.forced_kinds is not None:
            cmd += f" --kinds {','.join(self.forced_kinds)}"
        if self.skipped:
            cmd += f" --skip {','.join(self.skipped)}"
        return cmd

    def line(self) -> str:
        return (f"VIOLATION seed={self.seed} renewal={self.renewal} "
                f"kinds={','.join(self.kinds)}: {self.violations[0]}  "
                f"[{len(self.violations)} in all; replay: {self.command}]")


def run_case(seed: int, renewal: Renewal | None, kinds: tuple[str, ...] | None,
             skip: tuple[str, ...] = ()) -> Outcome:
    """Draw and run one case; a simulation that raises is a violation too."""
    started = time.perf_counter()
    case = _case(seed, renewal, kinds, skip)
    try:
        violations = tuple(case.run().violations)
    except Exception as e:  # the simulation itself broke: report it like a violation
        violations = (f"the simulation raised {type(e).__name__}: {e}",)
    return Outcome(seed, case.renewal, case.kinds, violations, time.perf_counter() - started,
                   kinds, skip)


def _case(seed: int, renewal: Renewal | None, kinds: tuple[str, ...] | None,
          skip: tuple[str, ...]) -> SwarmCase:
    return case_for(seed, renewal, kinds, pool=[k for k in KINDS if k not in skip])


def explore(*, seconds: float, seed: int, renewal: Renewal | None, jobs: int = 1,
            runs: int | None = None, first: bool = False,
            kinds: tuple[str, ...] | None = None, skip: tuple[str, ...] = (),
            out: TextIO | None = None) -> list[Outcome]:
    """Run cases until `seconds` pass (or `runs` cases ran, or the first
    violation with `first`); print a line per violation; return them all."""
    stream = out if out is not None else sys.stdout
    print(f"exploring {Path(shardlease.__file__).parent} for {seconds:g}s, seed {seed}, "
          f"renewal {renewal or 'both'}", file=stream, flush=True)
    seeds = random.Random(seed)
    # One worker spends its budget in CPU time, not wall time, so that a
    # seed and a budget run about the same cases on a loaded machine as on
    # an idle one: the suite's mutants (each caught within a budget) run
    # beside a few hundred processes on 2 cores, where 24 cases took 66 s
    # of wall time against 10 s alone. With workers, the wall.
    clock = time.process_time if jobs <= 1 else time.monotonic
    deadline = clock() + seconds
    started = time.perf_counter()
    found: list[Outcome] = []
    count = 0

    def report(o: Outcome) -> None:
        nonlocal count
        count += 1
        if o.violations:
            found.append(o)
            print(o.line(), file=stream, flush=True)

    def more() -> bool:
        return clock() < deadline and (runs is None or submitted < runs) \
            and not (first and found)

    submitted = 0
    if jobs <= 1:
        while more():
            submitted += 1
            report(run_case(seeds.getrandbits(32), renewal, kinds, skip))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            pending: set[Future[Outcome]] = set()
            while True:
                while more() and len(pending) < 2 * jobs:
                    submitted += 1
                    pending.add(pool.submit(run_case, seeds.getrandbits(32), renewal, kinds,
                                            skip))
                if not pending:
                    break
                done, pending = wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                                     return_when=FIRST_COMPLETED)
                for f in done:
                    report(f.result())
                if not done or (first and found):  # out of time: drop what is still running
                    for f in pending:
                        f.cancel()
                    break
    elapsed = time.perf_counter() - started
    rate = count / elapsed if elapsed > 0 else 0.0
    print(f"runs {count} in {elapsed:.1f}s ({rate:.2f} runs/s), seed {seed}, "
          f"violations {len(found)}", file=stream)
    if found:
        print(f"first: {found[0].line()}", file=stream)
    return found


def replay(seed: int, renewal: Renewal | None, kinds: tuple[str, ...] | None,
           skip: tuple[str, ...], tail: int) -> int:
    case = _case(seed, renewal, kinds, skip)
    print(case.describe())
    result = case.run()
    lines = result.format_trace().splitlines()
    print(f"trace (the last {min(tail, len(lines))} of {len(lines)} events):")
    print("\n".join(lines[-tail:]) if tail > 0 else "")
    print(f"violations ({len(result.violations)}):")
    for v in result.violations:
        print(f"  {v}")
    if result.violations:
        first = result.violations[0].replace('"', "'")
        print("as an entry of tests/sim/regressions.py (PENDING until fixed):")
        print(f'    Regression("seed-{seed}", "{",".join(case.kinds)}: {first}",\n'
              f"               {case!r}),")
    return 1 if result.violations else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardlease.sim.explore",
        description="Run random swarm cases of the simulation until a time budget is spent; "
                    "print each one that breaks an invariant (exit 1 if any did).")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="time budget: CPU seconds with one worker, wall seconds with "
                             "more (default 60)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seeds the sequence of cases (default: a random one, printed)")
    parser.add_argument("--renewal", choices=("shard", "node", "both"), default="both",
                        help="the renewal mode of every case, or both (drawn per case)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--runs", type=int, default=None, help="at most this many cases")
    parser.add_argument("--first", action="store_true", help="stop at the first violation")
    parser.add_argument("--kinds", default=None,
                        help="every case has faults of exactly these kinds (comma-separated: "
                        f"{', '.join(KINDS)})")
    parser.add_argument("--skip", default=None,
                        help="comma-separated fault kinds no case draws")
    parser.add_argument("--replay", type=int, default=None, metavar="CASE_SEED",
                        help="rerun one case: print it, its trace's tail and its violations")
    parser.add_argument("--tail", type=int, default=60, help="trace lines --replay prints")
    args = parser.parse_args(argv)
    renewal: Renewal | None = None if args.renewal == "both" else args.renewal

    def kind_list(text: str) -> tuple[str, ...]:
        names = tuple(k.strip() for k in text.split(",") if k.strip())
        unknown = sorted(set(names) - set(KINDS))
        if unknown or not names:
            parser.error(f"unknown fault kinds {unknown}; use some of {', '.join(KINDS)}")
        return names

    kinds = kind_list(args.kinds) if args.kinds else None
    skip = kind_list(args.skip) if args.skip else ()
    if set(skip) >= set(KINDS):
        parser.error("--skip leaves no fault kind")
    if args.replay is not None:
        return replay(args.replay, renewal, kinds, skip, args.tail)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    found = explore(seconds=args.seconds, seed=seed, renewal=renewal, jobs=args.jobs,
                    runs=args.runs, first=args.first, kinds=kinds, skip=skip)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
