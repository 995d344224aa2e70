"""`shardlease verify --history FILE`: judge a client history (docs/verify.md).

The history is JSON lines, one operation a line, as the clients of a
sharded key-value service saw them. Four judgements, and a verdict:

1. Linearizability of every key, as a register with write, read and
   compare-and-set: porcupine's, through the Go checker of
   tools/porcupine-check (built and cached by e2e/controlplane). Its
   "unknown" (a key's time limit ran out, or the history is over the cap)
   is a verdict of its own and never passes.
2. Lost acknowledged writes: an acknowledged write that the key's final
   read-back shows gone, the value read having been written before it.
3. Stale-generation writes: a value stored under a shard generation older
   than one the history had already seen open when the write was invoked.
4. Double opens, from the applications' own open and close records (an
   optional second file): a shard open on two instances at once.

Porcupine makes none of 2-4: the first is implied by linearizability only
when the read-back is in the history and porcupine finishes; the others are
about the storage's fencing and the lease protocol, which a register model
does not see. The last line of the summary is

    verify: seed X, N ops, linearizable: yes|no|unknown, lost acknowledged writes: K,
    stale-generation writes: M, double opens: D

(one line), and the exit status is 0 only when linearizable is yes and K, M
and D are 0; 1 for any other verdict, 2 when the files cannot be judged.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Generic, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_JUDGE = 0, 1, 2

# Times are integers on one clock; the checker's unknown operations return
# one past the history's last time, which must still fit Go's int64.
Time: TypeAlias = Annotated[int, Field(ge=0, le=2**62)]
# Histories are untrusted input: every text is bounded.
Text: TypeAlias = Annotated[str, Field(max_length=4096)]
Ident: TypeAlias = Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=256)]
# A line longer than this is refused before it is parsed (the Go checker
# refuses the same).
MAX_LINE = 1 << 20
# Each kind of violation prints at most this many examples before its count.
MAX_EXAMPLES = 20


class Operation(BaseModel):
    """One line of a history (docs/verify.md has the full meaning)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    client: Ident
    op: Literal["write", "read", "cas"]
    key: Text
    # write: the value written; cas: the value swapped in; read: the value
    # read (null: the key had none).
    value: Text | None = None
    # cas only: the value compared against (null: the key has none).
    expected: Text | None = None
    # cas with outcome ok only: whether it swapped.
    swapped: bool | None = None
    invoked: Time
    # Required for ok and failed; an unknown operation's is ignored (it may
    # take effect at any time after its invocation).
    completed: Time | None = None
    outcome: Literal["ok", "failed", "unknown"]
    # The shard generation the value was stored under: write and swapped
    # cas, the one that stored it; read, the one stored with the value read;
    # a cas that did not swap, the one that answered.
    generation: Annotated[int, Field(ge=0)] | None = None
    shard: Ident | None = None
    # A read of the read-back at the end of the history.
    final: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> Operation:
        if self.op in ("write", "cas") and self.value is None:
            raise ValueError(f"a {self.op} needs the value it writes")
        if self.op != "cas" and self.expected is not None:
            raise ValueError("only a cas has expected")
        if (self.op == "cas" and self.outcome == "ok") != (self.swapped is not None):
            raise ValueError("swapped is required on an ok cas, and only there")
        if self.op == "read" and self.outcome != "ok" and self.value is not None:
            raise ValueError("a read that did not answer read no value")
        if self.final and self.op != "read":
            raise ValueError("only a read is part of the final read-back")
        if self.outcome != "unknown" and self.completed is None:
            raise ValueError(f"an operation whose outcome is {self.outcome} needs completed")
        if self.completed is not None and self.completed < self.invoked:
            raise ValueError("completed is before invoked")
        return self

    @property
    def acknowledged_write(self) -> bool:
        """The client was told this operation stored its value."""
        return self.outcome == "ok" and (self.op == "write" or bool(self.swapped))


class OpenRecord(BaseModel):
    """One line of the applications' open/close records (docs/verify.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    shard: Ident
    instance: Text
    # open: when the instance began to open the shard (before it touched
    # the storage); close: when its close had finished (storage shut down).
    event: Literal["open", "close"]
    time: Time
    generation: Annotated[int, Field(ge=0)] | None = None


class HistoryError(Exception):
    """The file cannot be judged (unreadable, malformed, or incomplete)."""


class CheckerError(Exception):
    """The Go checker could not be found, built or run."""


R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class Line(Generic[R]):
    """A record and the line of its file (1-based), for the reports."""

    number: int
    record: R


def _records(path: Path, model: type[R]) -> Iterator[Line[R]]:
    try:
        f = path.open("rb")
    except OSError as e:
        raise HistoryError(f"{path}: {e.strerror or e}") from e
    with f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
            if len(raw) > MAX_LINE:
                raise HistoryError(f"{path}: line {number}: longer than {MAX_LINE} bytes")
            if not raw.strip():
                continue
            try:
                yield Line(number, model.model_validate_json(raw))
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                what = f"{where}: {first['msg']}" if where else first["msg"]
                raise HistoryError(f"{path}: line {number}: {what}") from None


def read_history(path: Path) -> list[Line[Operation]]:
    ops = list(_records(path, Operation))
    # Lost and stale writes are told apart by the value a read returns: a
    # value written twice would make a read's origin ambiguous.
    seen: dict[tuple[str, str], int] = {}
    for line in ops:
        op = line.record
        if op.op == "read" or op.value is None:
            continue
        first = seen.setdefault((op.key, op.value), line.number)
        if first != line.number:
            raise HistoryError(f"{path}: line {line.number}: key {op.key!r} is written "
                               f"{op.value!r} again (line {first}); values written to a key "
                               "must be unique")
    return ops


def read_opens(path: Path) -> list[Line[OpenRecord]]:
    return list(_records(path, OpenRecord))


# -- lost acknowledged writes ------------------------------------------------

@dataclass(frozen=True)
class LostWrite:
    key: str
    value: str
    line: int
    read_line: int
    read_value: str | None

    def describe(self) -> str:
        read = "absent" if self.read_value is None else repr(self.read_value)
        return (f"lost acknowledged write: key {self.key!r}, {self.value!r} (line {self.line}): "
                f"the final read-back (line {self.read_line}) returned {read}, older than it")


def lost_writes(ops: Sequence[Line[Operation]]) -> list[LostWrite]:
    """Acknowledged writes the key's final read-back shows gone.

    A write W is lost when the final read R returned the value of a write
    that had completed before W was invoked (or the key's absence, or a
    value nobody wrote), and W itself completed before R was invoked: W
    must then be between that value and R, and only a later write could
    replace it. Of such writes, only those no other one followed are
    counted: an earlier one was overwritten by the later, as it should be.

    Every key with an acknowledged write must have an answered final read
    (raises HistoryError): without one, nothing can be said.
    """
    by_key: dict[str, list[Line[Operation]]] = defaultdict(list)
    for line in ops:
        by_key[line.record.key].append(line)
    lost: list[LostWrite] = []
    unread: list[str] = []
    for key, lines in by_key.items():
        acked = [x for x in lines if x.record.acknowledged_write]
        if not acked:
            continue
        finals = [x for x in lines if x.record.final and x.record.outcome == "ok"]
        if not finals:
            unread.append(key)
            continue
        read = max(finals, key=lambda x: x.record.invoked)
        value = read.record.value
        # When the value read became the key's value, at the latest; -1:
        # before every write (absence, or a value no write stored: never
        # written, refused, or a cas that did not swap).
        origin = -1
        if value is not None:
            writer = next((x.record for x in lines if x.record.op != "read"
                           and x.record.value == value), None)
            if writer is not None and writer.acknowledged_write:
                assert writer.completed is not None
                origin = writer.completed
            elif writer is not None and writer.outcome == "unknown":
                # It may have landed at any time after its invocation, so
                # no write is known to follow it.
                origin = 2**63
        candidates = [x for x in acked if x.record.invoked > origin
                      and x.record.completed is not None
                      and x.record.completed < read.record.invoked
                      and x.record.value != value]
        if not candidates:
            continue
        latest = max(x.record.invoked for x in candidates)
        for x in candidates:
            assert x.record.completed is not None and x.record.value is not None
            if x.record.completed >= latest:
                lost.append(LostWrite(key, x.record.value, x.number, read.number, value))
    if unread:
        names = ", ".join(repr(k) for k in sorted(unread)[:5])
        more = f" and {len(unread) - 5} more" if len(unread) > 5 else ""
        raise HistoryError(f"key {names}{more} has acknowledged writes but no answered final "
                           "read-back (a read with \"final\": true): the lost-write check needs "
                           "one per written key")
    return sorted(lost, key=lambda w: w.line)


# -- stale-generation writes -------------------------------------------------

@dataclass(frozen=True)
class StaleWrite:
    key: str
    value: str
    line: int
    generation: int
    newer: int
    newer_line: int

    def describe(self) -> str:
        return (f"stale-generation write: key {self.key!r}, {self.value!r} (line {self.line}) "
                f"stored under generation {self.generation}, after generation {self.newer} "
                f"was seen open (line {self.newer_line} completed before it was invoked)")


def _scope(op: Operation) -> tuple[str, int | str]:
    # Generations are a shard's; a history without shards compares a key's.
    return ("shard", op.shard) if op.shard is not None else ("key", op.key)


def stale_generation_writes(ops: Sequence[Line[Operation]]) -> list[StaleWrite]:
    """Values stored under a generation older than one already open.

    Any answered operation that carries generation G proves G was open by
    the time it completed. A write invoked after that and stored under an
    older generation was made durable by a superseded owner: its storage did
    not fence it. A write's storage generation comes from its own answer, or
    from a read that returned its value (so a write whose answer was lost is
    judged too).
    """
    # scope -> (completion times, sorted; the highest generation seen by each,
    # and the line that showed it)
    evidence: dict[tuple[str, int | str], list[tuple[int, int, int]]] = defaultdict(list)
    stored: dict[tuple[str, str], set[int]] = defaultdict(set)
    writes: dict[tuple[str, str], Line[Operation]] = {}
    for line in ops:
        op = line.record
        if op.op != "read" and op.value is not None:
            writes[(op.key, op.value)] = line
        if op.outcome != "ok" or op.generation is None:
            continue
        assert op.completed is not None
        evidence[_scope(op)].append((op.completed, op.generation, line.number))
        if op.acknowledged_write or (op.op == "read" and op.value is not None):
            assert op.value is not None
            stored[(op.key, op.value)].add(op.generation)
    highest: dict[tuple[str, int | str], tuple[list[int], list[tuple[int, int]]]] = {}
    for scope, seen in evidence.items():
        seen.sort()
        times: list[int] = []
        best: list[tuple[int, int]] = []
        top = (-1, 0)
        for completed, generation, number in seen:
            if generation > top[0]:
                top = (generation, number)
            times.append(completed)
            best.append(top)
        highest[scope] = (times, best)
    stale: list[StaleWrite] = []
    for (key, value), generations in stored.items():
        writer = writes.get((key, value))
        if writer is None:
            continue  # a value nobody wrote: linearizability's to report
        times, best = highest.get(_scope(writer.record), ([], []))
        i = bisect.bisect_left(times, writer.record.invoked)
        if i == 0:
            continue
        newer, newer_line = best[i - 1]
        old = min(generations)
        if newer > old:
            stale.append(StaleWrite(key, value, writer.number, old, newer, newer_line))
    return sorted(stale, key=lambda w: w.line)


# -- double opens ------------------------------------------------------------

@dataclass(frozen=True)
class DoubleOpen:
    shard: int | str
    instance: str
    line: int
    other: str
    other_line: int
    time: int

    def describe(self) -> str:
        return (f"double open: shard {self.shard!r} opened on {self.instance!r} (line "
                f"{self.line}) at {self.time} while open on {self.other!r} (since line "
                f"{self.other_line})")


def double_opens(records: Iterable[Line[OpenRecord]]) -> list[DoubleOpen]:
    """Opens of a shard on one instance while another had it open.

    An instance has a shard open from the start of its open to the end of
    its close (or the end of the records). At equal times an open counts
    before a close: the clocks cannot order them, so they are taken to
    overlap.
    """
    by_shard: dict[int | str, list[Line[OpenRecord]]] = defaultdict(list)
    for line in records:
        by_shard[line.record.shard].append(line)
    found: list[DoubleOpen] = []
    for shard, lines in by_shard.items():
        lines.sort(key=lambda x: (x.record.time, x.record.event != "open", x.number))
        open_on: dict[str, int] = {}  # instance -> line of its open
        for x in lines:
            rec = x.record
            if rec.event == "close":
                open_on.pop(rec.instance, None)
                continue
            for other, other_line in open_on.items():
                if other != rec.instance:
                    found.append(DoubleOpen(shard, rec.instance, x.number, other, other_line,
                                            rec.time))
            open_on.setdefault(rec.instance, x.number)
    return sorted(found, key=lambda d: d.line)


# -- linearizability (the Go checker) ----------------------------------------

class KeyReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    key: str
    result: Literal["ok", "illegal", "unknown"]
    ops: int
    seconds: float
    visualization: str = ""
    error: str = ""


class CheckerReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    linearizable: Literal["yes", "no", "unknown"]
    ops: int
    reason: str = ""
    keys: list[KeyReport]


CHECKER_ENV = "SHARDLEASE_PORCUPINE_CHECK"


def find_checker(explicit: str | None = None) -> Path:
    """The porcupine-check binary: --checker, else $SHARDLEASE_PORCUPINE_CHECK,
    else the one e2e/controlplane builds and caches from this checkout."""
    given = explicit or os.environ.get(CHECKER_ENV)
    if given:
        path = Path(given)
        if not os.access(path, os.X_OK):
            raise CheckerError(f"the checker {path} is not an executable file")
        return path
    script = Path(__file__).resolve().parents[2] / "e2e" / "controlplane.py"
    if not script.is_file():
        raise CheckerError("no porcupine-check: build it from a checkout of shardlease "
                           "(e2e/controlplane build porcupine-check) and pass --checker "
                           f"or ${CHECKER_ENV}")
    # Its build progress goes to our stderr: a first build takes a while.
    proc = subprocess.run([sys.executable, str(script), "path", "porcupine-check"],
                          stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise CheckerError("could not build porcupine-check (e2e/controlplane build "
                           "porcupine-check says why)")
    return Path(proc.stdout.strip())


def check_linearizability(history: Path, checker: Path, time_limit_s: float, max_ops: int,
                          html_dir: Path) -> CheckerReport:
    cmd = [str(checker), "-json", "-time-limit-per-key", f"{time_limit_s}s",
           "-max-ops", str(max_ops), "-html-dir", str(html_dir), str(history)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise CheckerError(f"cannot run {checker}: {e.strerror or e}") from e
    # 0 yes, 1 no, 3 unknown; anything else is the checker's failure.
    if proc.returncode not in (0, 1, 3):
        tail = proc.stderr.strip().splitlines()[-5:]
        raise CheckerError(f"{checker.name} exited {proc.returncode}: " + " / ".join(tail))
    try:
        report = CheckerReport.model_validate_json(proc.stdout)
    except ValidationError as e:
        raise CheckerError(f"{checker.name} answered what is not its report: {e}") from None
    expected = {"yes": 0, "no": 1, "unknown": 3}[report.linearizable]
    if expected != proc.returncode:
        raise CheckerError(f"{checker.name} said {report.linearizable} but exited "
                           f"{proc.returncode}")
    return report


# -- the verdict -------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    ops: int
    linearizable: Literal["yes", "no", "unknown"]
    lost: list[LostWrite]
    stale: list[StaleWrite]
    doubles: list[DoubleOpen]
    report: CheckerReport

    @property
    def passed(self) -> bool:
        return (self.linearizable == "yes" and not self.lost and not self.stale
                and not self.doubles)

    def summary_line(self, seed: str = "-") -> str:
        return (f"verify: seed {seed}, {self.ops} ops, linearizable: {self.linearizable}, "
                f"lost acknowledged writes: {len(self.lost)}, "
                f"stale-generation writes: {len(self.stale)}, double opens: {len(self.doubles)}")

    def lines(self, seed: str = "-") -> list[str]:
        out: list[str] = []
        for k in self.report.keys:
            if k.result == "ok":
                continue
            what = "not linearizable" if k.result == "illegal" else \
                "unknown (porcupine's time limit ran out)"
            line = f"linearizability: key {k.key!r}: {what} ({k.ops} ops, {k.seconds:.2f} s)"
            if k.visualization:
                line += f"; porcupine's visualization: {k.visualization}"
            if k.error:
                line += f"; {k.error}"
            out.append(line)
        if self.report.reason:
            out.append(f"linearizability: {self.report.reason}")
        for found in (self.lost, self.stale, self.doubles):
            out += [x.describe() for x in found[:MAX_EXAMPLES]]
            if len(found) > MAX_EXAMPLES:
                out.append(f"... and {len(found) - MAX_EXAMPLES} more like it")
        out.append(self.summary_line(seed))
        return out


def judge(history: Path, *, opens: Path | None = None, checker: Path, time_limit_s: float = 10.0,
          max_ops: int = 100_000, html_dir: Path | None = None) -> Verdict:
    """Judge a history file (and the open/close records, when given).

    Raises HistoryError when a file cannot be judged, CheckerError when the
    Go checker cannot be run.
    """
    ops = read_history(history)
    lost = lost_writes(ops)
    stale = stale_generation_writes(ops)
    doubles = double_opens(read_opens(opens)) if opens is not None else []
    report = check_linearizability(history, checker, time_limit_s, max_ops,
                                   html_dir if html_dir is not None else history.parent)
    if report.ops != len(ops):
        raise CheckerError(f"{checker.name} read {report.ops} operations, verify {len(ops)}")
    return Verdict(len(ops), report.linearizable, lost, stale, doubles, report)


def cmd_verify(args: argparse.Namespace) -> int:
    """`shardlease verify --history FILE [--opens FILE] ...`"""
    def cannot(message: str) -> int:
        print(f"shardlease verify: cannot judge: {message}", file=sys.stderr)
        return EXIT_CANNOT_JUDGE

    if args.time_limit_per_key <= 0:
        return cannot("--time-limit-per-key must be positive")
    if args.max_ops < 1:
        return cannot("--max-ops must be at least 1")
    try:
        checker = find_checker(args.checker)
        verdict = judge(Path(args.history), opens=Path(args.opens) if args.opens else None,
                        checker=checker, time_limit_s=args.time_limit_per_key,
                        max_ops=args.max_ops,
                        html_dir=Path(args.html_dir) if args.html_dir else None)
    except (HistoryError, CheckerError) as e:
        return cannot(str(e))
    for line in verdict.lines():
        print(line)
    sys.stdout.flush()
    return EXIT_OK if verdict.passed else EXIT_FAILED


def dump_history(ops: Iterable[Operation]) -> str:
    """`ops` as a history file's text (JSON lines), the fields at their
    defaults left out."""
    return "".join(json.dumps(op.model_dump(exclude_defaults=True)) + "\n" for op in ops)
