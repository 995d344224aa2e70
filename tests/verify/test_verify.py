"""`shardlease verify --history`: recorded histories, good and bad, judged by
the real Go checker (porcupine) and the checks beside it.

Each bad history is caught by the check meant for it, and each good one
passes; where a history is good only because of how an outcome is modelled
(an unknown write that may have landed), the same history with that outcome
changed fails, so the passing case is no accident of a lenient judge.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shardlease_tools.verify import (
    HistoryError,
    OpenRecord,
    Operation,
    Verdict,
    dump_history,
    judge,
)

ROOT = Path(__file__).resolve().parents[2]
LAST_LINE = re.compile(
    r"verify: seed (\S+), (\d+) ops, linearizable: (yes|no|unknown), lost acknowledged "
    r"writes: (\d+), stale-generation writes: (\d+), double opens: (\d+)")


def op(client: int, kind: str, key: str, value: str | None, t: tuple[int, int | None],
       outcome: str = "ok", **extra: Any) -> Operation:
    fields: dict[str, Any] = {"client": client, "op": kind, "key": key, "value": value,
                              "invoked": t[0], "completed": t[1], "outcome": outcome,
                              "shard": 0, **extra}
    if kind != "read" or outcome == "ok":
        fields.setdefault("generation", 1 if outcome == "ok" else None)
    return Operation.model_validate(fields)


def write(client: int, key: str, value: str, t: tuple[int, int | None], outcome: str = "ok",
          **extra: Any) -> Operation:
    return op(client, "write", key, value, t, outcome, **extra)


def read(client: int, key: str, value: str | None, t: tuple[int, int | None],
         outcome: str = "ok", **extra: Any) -> Operation:
    if value is None and outcome == "ok":
        extra.setdefault("generation", None)
    return op(client, "read", key, value, t, outcome, **extra)


def final(key: str, value: str | None, t: int = 1000, **extra: Any) -> Operation:
    return read(99, key, value, (t, t + 10), final=True, **extra)


def cas(client: int, key: str, expected: str | None, value: str, t: tuple[int, int | None],
        swapped: bool | None, outcome: str = "ok", **extra: Any) -> Operation:
    return op(client, "cas", key, value, t, outcome, expected=expected, swapped=swapped,
              **extra)


def history(tmp_path: Path, ops: Sequence[Operation], name: str = "history.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(dump_history(ops))
    return path


def opens_file(tmp_path: Path, rows: Sequence[tuple[int, str, str, int]]) -> Path:
    path = tmp_path / "opens.jsonl"
    path.write_text("".join(
        OpenRecord.model_validate({"shard": s, "instance": i, "event": e, "time": t})
        .model_dump_json() + "\n" for s, i, e, t in rows))
    return path


def verdict(tmp_path: Path, checker: Path, ops: Sequence[Operation], **kw: Any) -> Verdict:
    v = judge(history(tmp_path, ops), checker=checker, html_dir=tmp_path / "html", **kw)
    print("\n".join(v.lines()))
    return v


def counts(v: Verdict) -> tuple[str, int, int, int]:
    return v.linearizable, len(v.lost), len(v.stale), len(v.doubles)


# -- good histories -------------------------------------------------------------------

def test_concurrent_writes_reads_and_compare_and_sets_pass(tmp_path: Path,
                                                            checker: Path) -> None:
    ops = [
        # Two writes at once; reads during them may see either, in either
        # order, as long as they agree with one order of the two.
        write(0, "a", "a0", (0, 100)),
        write(1, "a", "a1", (10, 90)),
        read(2, "a", "a1", (20, 30)),
        read(3, "a", "a0", (40, 120)),
        read(2, "a", "a0", (130, 140)),
        # A compare-and-set that found what it expected, one that did not,
        # and one whose expectation was the key's absence.
        cas(0, "a", "a0", "a2", (150, 160), swapped=True),
        cas(1, "a", "a0", "a3", (170, 180), swapped=False),
        cas(2, "b", None, "b0", (150, 170), swapped=True),
        read(3, "b", "b0", (165, 175)),
        # A failed write took no effect.
        write(0, "b", "b1", (200, 210), outcome="failed", generation=None),
        read(1, "c", None, (0, 5)),
        final("a", "a2"), final("b", "b0"),
    ]
    v = verdict(tmp_path, checker, ops)
    assert counts(v) == ("yes", 0, 0, 0)
    assert v.passed
    assert v.lines()[-1] == ("verify: seed -, 13 ops, linearizable: yes, lost acknowledged "
                             "writes: 0, stale-generation writes: 0, double opens: 0")


def test_an_unknown_write_that_landed_after_its_client_gave_up_is_linearizable(
        tmp_path: Path, checker: Path) -> None:
    """Its client gave up at 30; a read after that still saw the old value,
    and a later one the new: only "may take effect at any time after its
    invocation" (its completion at the end of the history, not when the
    client stopped waiting) explains both."""
    def ops(outcome: str) -> list[Operation]:
        return [write(0, "k", "v0", (0, 10)),
                write(1, "k", "v1", (20, 30), outcome, generation=None),
                read(2, "k", "v0", (40, 50)),
                read(2, "k", "v1", (500, 510)),
                final("k", "v1")]

    assert counts(verdict(tmp_path, checker, ops("unknown"))) == ("yes", 0, 0, 0)
    # Had the write been refused, the read saw a value from nowhere.
    assert verdict(tmp_path, checker, ops("failed")).linearizable == "no"


def test_an_unknown_write_nobody_saw_may_not_have_happened(tmp_path: Path,
                                                            checker: Path) -> None:
    def ops(outcome: str) -> list[Operation]:
        return [write(0, "k", "v0", (0, 10)),
                write(1, "k", "v1", (20, 30), outcome,
                      generation=None if outcome == "unknown" else 1),
                read(2, "k", "v0", (40, 50)),
                final("k", "v0")]

    assert counts(verdict(tmp_path, checker, ops("unknown"))) == ("yes", 0, 0, 0)
    # Acknowledged, the same write was lost: the read-back is older.
    v = verdict(tmp_path, checker, ops("ok"))
    assert counts(v) == ("no", 1, 0, 0)
    assert v.lost[0].value == "v1"


def test_an_unknown_compare_and_set_may_have_swapped(tmp_path: Path, checker: Path) -> None:
    ops = [write(0, "k", "v0", (0, 10)),
           cas(1, "k", "v0", "v1", (20, None), swapped=None, outcome="unknown",
               generation=None),
           read(2, "k", "v1", (40, 50)),
           final("k", "v1")]
    assert counts(verdict(tmp_path, checker, ops)) == ("yes", 0, 0, 0)
    # It could not have swapped had the key held another value.
    ops[0] = write(0, "k", "other", (0, 10))
    assert verdict(tmp_path, checker, ops).linearizable == "no"


def test_the_example_in_the_docs_passes(tmp_path: Path, checker: Path) -> None:
    text = (ROOT / "docs" / "verify.md").read_text()
    block = text.split("An example (times in nanoseconds):", 1)[1]
    lines = block.split("```json\n", 1)[1].split("```", 1)[0]
    ops = [Operation.model_validate_json(line) for line in lines.splitlines()]
    assert len(ops) == 5
    assert counts(verdict(tmp_path, checker, ops)) == ("yes", 0, 0, 0)


# -- bad histories --------------------------------------------------------------------

def test_a_stale_read_after_a_write_completed_is_not_linearizable(tmp_path: Path,
                                                                   checker: Path) -> None:
    ops = [write(0, "k", "new", (0, 10)),
           # Invoked after the write was acknowledged, yet it reads nothing:
           # a paused old owner serving what it had.
           read(1, "k", None, (20, 30)),
           final("k", "new"),
           write(0, "fine", "x", (0, 10)), final("fine", "x")]
    v = verdict(tmp_path, checker, ops)
    assert counts(v) == ("no", 0, 0, 0)
    bad = [k for k in v.report.keys if k.result != "ok"]
    assert [(k.key, k.result) for k in bad] == [("k", "illegal")]
    page = Path(bad[0].visualization)
    assert page.parent == tmp_path / "html"
    # Porcupine's page, its data this key's operations.
    data = json.loads(page.read_text().split("const data = ", 1)[1].split("\n", 1)[0])
    described = {h["Description"] for h in data["Partitions"][0]["History"]}
    assert described == {'write("new")', "read() -> absent", 'read() -> "new"'}
    assert any(str(page) in line for line in v.lines()[:-1])
    assert not v.passed


def test_a_lost_acknowledged_write_is_counted(tmp_path: Path, checker: Path) -> None:
    ops = [write(0, "k", "v0", (0, 10)),
           write(1, "k", "v1", (20, 30)),
           final("k", "v0")]
    v = verdict(tmp_path, checker, ops)
    assert counts(v) == ("no", 1, 0, 0)
    assert (v.lost[0].key, v.lost[0].value, v.lost[0].line) == ("k", "v1", 2)


def test_lost_writes_count_the_latest_not_those_they_overwrote(tmp_path: Path,
                                                                checker: Path) -> None:
    ops = [write(0, "k", "v0", (0, 10)),
           write(1, "k", "v1", (20, 30)),
           # Two acknowledged at once, after both of the above: either may
           # be the key's last value, and the read-back shows neither.
           write(2, "k", "v2", (40, 60)),
           write(3, "k", "v3", (50, 70)),
           final("k", None)]
    v = verdict(tmp_path, checker, ops)
    assert sorted(w.value for w in v.lost) == ["v2", "v3"]
    # A write still running when the read-back began may come after it.
    ops = [write(0, "k", "v0", (0, 10)),
           write(1, "k", "v1", (20, 2000)),
           final("k", "v0")]
    assert counts(verdict(tmp_path, checker, ops)) == ("yes", 0, 0, 0)


def test_a_write_stored_under_a_stale_generation_is_counted(tmp_path: Path,
                                                            checker: Path) -> None:
    ops = [write(0, "a", "a0", (0, 10), generation=2),
           # Invoked after generation 2 answered on the same shard, stored
           # by generation 1's owner: its storage did not fence it. Each
           # key on its own is still a fine register.
           write(1, "b", "b0", (20, 30), generation=1),
           final("a", "a0", generation=2), final("b", "b0", generation=1)]
    v = verdict(tmp_path, checker, ops)
    assert counts(v) == ("yes", 0, 1, 0)
    stale = v.stale[0]
    assert (stale.key, stale.generation, stale.newer, stale.newer_line) == ("b", 1, 2, 1)
    # The same write, overlapping generation 2's first answer, is not stale:
    # the new owner may not have been open yet when it was stored.
    ops[1] = write(1, "b", "b0", (5, 30), generation=1)
    assert counts(verdict(tmp_path, checker, ops)) == ("yes", 0, 0, 0)
    # On another shard, generation 2 says nothing about it.
    ops[1] = write(1, "b", "b0", (20, 30), generation=1, shard=1)
    ops[3] = final("b", "b0", generation=1, shard=1)
    assert counts(verdict(tmp_path, checker, ops)) == ("yes", 0, 0, 0)


def test_a_write_whose_answer_was_lost_is_judged_by_the_generation_it_was_read_with(
        tmp_path: Path, checker: Path) -> None:
    ops = [cas(0, "a", None, "a0", (0, 10), swapped=True, generation=3),
           write(1, "b", "b0", (20, None), outcome="unknown", generation=None),
           read(2, "b", "b0", (40, 50), generation=2),
           final("a", "a0", generation=3), final("b", "b0", generation=2)]
    v = verdict(tmp_path, checker, ops)
    assert counts(v) == ("yes", 0, 1, 0)
    assert (v.stale[0].value, v.stale[0].generation, v.stale[0].newer) == ("b0", 2, 3)


def test_a_shard_open_on_two_instances_at_once_is_a_double_open(tmp_path: Path,
                                                                checker: Path) -> None:
    ops = [write(0, "k", "v", (0, 10)), final("k", "v")]
    path = history(tmp_path, ops)
    handoff = [(0, "a", "open", 0), (0, "a", "close", 100), (0, "b", "open", 101),
               (1, "b", "open", 0), (1, "a", "open", 50)]  # shard 1: b never closed
    v = judge(path, opens=opens_file(tmp_path, handoff), checker=checker)
    assert counts(v) == ("yes", 0, 0, 1)
    d = v.doubles[0]
    assert (d.shard, d.instance, d.other, d.time) == (1, "a", "b", 50)
    # A close and the next open at the same time: the clock cannot order
    # them, so they overlap.
    touching = [(0, "a", "open", 0), (0, "a", "close", 100), (0, "b", "open", 100)]
    v = judge(path, opens=opens_file(tmp_path, touching), checker=checker)
    assert counts(v) == ("yes", 0, 0, 1)
    clean = [(0, "a", "open", 0), (0, "a", "open", 5), (0, "a", "close", 100),
             (0, "b", "open", 101), (0, "b", "close", 200)]
    assert judge(path, opens=opens_file(tmp_path, clean), checker=checker).passed


# -- porcupine's unknown is not a yes -------------------------------------------------

def test_a_history_over_the_cap_is_unknown(tmp_path: Path, checker: Path) -> None:
    ops = [write(0, "k", "v", (0, 10)), read(1, "k", "v", (20, 30)), final("k", "v")]
    v = verdict(tmp_path, checker, ops, max_ops=2)
    assert counts(v) == ("unknown", 0, 0, 0)
    assert not v.passed
    assert "over the cap of 2" in v.report.reason
    assert verdict(tmp_path, checker, ops, max_ops=3).passed


def test_a_key_whose_time_limit_runs_out_is_unknown(tmp_path: Path, checker: Path) -> None:
    """24 writes at once and then a read of a value none of them wrote: to
    call it a violation porcupine must try every order of the writes (some
    200 million states), far past a 0.2 s limit."""
    ops = [write(i, "k", f"v{i}", (0, 1000), outcome="unknown", generation=None)
           for i in range(24)]
    ops.append(read(30, "k", "nobody's", (2000, 2010), generation=None))
    ops.append(read(30, "fine", None, (0, 10)))
    v = verdict(tmp_path, checker, ops, time_limit_s=0.2)
    assert counts(v) == ("unknown", 0, 0, 0)
    assert [(k.key, k.result) for k in v.report.keys] == [("fine", "ok"), ("k", "unknown")]
    assert not v.passed


# -- what cannot be judged ------------------------------------------------------------

GOOD = {"client": 0, "op": "write", "key": "k", "value": "v", "invoked": 0, "completed": 1,
        "outcome": "ok", "generation": 1}


@pytest.mark.parametrize(("change", "says"), [
    ({"completd": 5}, "completd"),  # a misspelt field
    ({"completed": None}, "needs completed"),
    ({"invoked": 5}, "completed is before invoked"),
    ({"op": "cas", "expected": "u"}, "swapped is required"),
    ({"op": "delete"}, "op"),
    ({"value": None}, "needs the value"),
    ({"invoked": "0"}, "invoked"),  # strings are not times
    ({"outcome": "maybe"}, "outcome"),
])
def test_a_malformed_record_is_refused_with_its_line(tmp_path: Path, checker: Path,
                                                      change: dict[str, Any], says: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({**GOOD, **change}) + "\n")
    with pytest.raises(HistoryError, match="line 3") as e:
        judge(path, checker=checker)
    assert says in str(e.value)


def test_a_value_written_twice_or_a_key_never_read_back_cannot_be_judged(
        tmp_path: Path, checker: Path) -> None:
    twice = [write(0, "k", "v", (0, 10)), write(1, "k", "v", (20, 30)), final("k", "v")]
    with pytest.raises(HistoryError, match="written 'v' again"):
        judge(history(tmp_path, twice), checker=checker)
    unread = [write(0, "k", "v", (0, 10)), read(1, "k", "v", (20, 30))]
    with pytest.raises(HistoryError, match="no answered final read-back"):
        judge(history(tmp_path, unread), checker=checker)


def test_the_go_checker_alone_refuses_what_it_cannot_read(tmp_path: Path,
                                                         checker: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({**GOOD, "extra": 1}) + "\n")
    result = subprocess.run([str(checker), str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "line 1" in result.stderr and "extra" in result.stderr


# -- as a user types it ---------------------------------------------------------------

def shardlease(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardlease", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_command_prints_the_verdict_last_and_exits_by_it(tmp_path: Path,
                                                             checker: Path) -> None:
    # No --checker: the command finds the one the build script cached.
    good = history(tmp_path, [write(0, "k", "v0", (0, 10)), read(1, "k", "v0", (20, 30)),
                              final("k", "v0")], "good.jsonl")
    result = shardlease("verify", "--history", str(good))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        "verify: seed -, 3 ops, linearizable: yes, lost acknowledged writes: 0, "
        "stale-generation writes: 0, double opens: 0")

    bad = history(tmp_path, [
        # Lost: v1 was acknowledged after v0, and v0 is read back.
        write(0, "k", "v0", (0, 10)), write(1, "k", "v1", (20, 30)), final("k", "v0"),
        # Stale: on shard 1, generation 2 answered before generation 1 stored j0.
        write(2, "m", "m0", (0, 10), generation=2, shard=1),
        final("m", "m0", generation=2, shard=1),
        write(3, "j", "j0", (60, 70), generation=1, shard=1), final("j", "j0", shard=1),
    ], "bad.jsonl")
    opens = opens_file(tmp_path, [(0, "a", "open", 0), (0, "b", "open", 5)])
    result = shardlease("verify", "--history", str(bad), "--opens", str(opens),
                        "--html-dir", str(tmp_path / "pages"))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    m = LAST_LINE.fullmatch(lines[-1])
    assert m is not None, lines[-1]
    assert m.groups() == ("-", "7", "no", "1", "1", "1")
    pages = list((tmp_path / "pages").glob("*.html"))
    assert len(pages) == 1 and any(str(pages[0]) in line for line in lines)


def test_the_command_says_in_one_line_why_it_cannot_judge(tmp_path: Path,
                                                          checker: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("{not json\n")
    result = shardlease("verify", "--history", str(path), "--checker", str(checker))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("shardlease verify: cannot judge:")
    assert "line 1" in result.stderr and len(result.stderr.splitlines()) == 1
    missing = shardlease("verify", "--history", str(tmp_path / "nope.jsonl"),
                         "--checker", str(checker))
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr
