"""A slow and a throttling S3, on real node processes (issue #8, item 1).

Three `shardlease node` processes on MinIO, lease TTL 3 s, 12 shards; one of
them (n1) reaches MinIO through the fault-injecting proxy, so every request
it makes (heartbeats, listings, GETs, claims and renewals alike) gets the
phase's fault, and its peers none. Phases of 4 TTLs each, one after the
other: no fault, +0.15 x TTL of latency, +0.3 x TTL, 30% of the requests
answered 503 SlowDown, +0.5 x TTL; then no fault again until balanced.

Asserted: no two open owners of one shard at any time (the overlap checker,
conservative window), over the whole run; in every phase but the last the
slowed node loses nothing and, but for a renewal of which the store refused
every try, fences nothing and keeps every shard it had (it renews on a
schedule of its own, within budgets, retried by the loop and not by
botocore); and it gets its fair share back once the faults end.

At +0.5 x TTL holding is impossible for any engine that renews by
compare-and-swap: a renewal needs the version the previous one returned, so
renewals are at least one latency apart and each is answered a latency after
it was sent: 2 x 1.5 s > TTL - margin = 2.5 s. The node fences in time (the
checker's rule); its shards then stay open nowhere until the fault ends,
because its heartbeats still land and its peers, counting it live, stay at
their share (printed as shard-seconds open nowhere; not asserted).

The figures per phase are printed (pytest -s), never asserted as durations;
the proxy's request history is written beside the nodes' logs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from typing import Any

import pytest

from shardlease.checker import check_events, load_events
from shardlease_tools.bench import SLOW_KEEPS, SLOW_PHASES, open_on, phase_figures
from shardlease_tools.faultproxy import Faults, Seen
from tests.support.faultproxy import MakeProxy
from tests.support.s3server import S3Server
from tests.support.stalls import StallWatch

from .cluster import counts
from .conftest import MakeCluster, one_behind_a_proxy
from .test_nodes import wait_events

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.s3server", "tests.support.faultproxy"]

NAMES = ["n0", "n1", "n2"]
SLOWED = "n1"
SHARDS = 12
TTL = 3.0
PHASE = 4 * TTL


#: Fewest tries a renewal gets before its deadline at this TTL: from about an
#: interval (1 s) after the last one landed to the deadline, 2.5 s after it,
#: with pauses doubling from 0.05 s up to 0.25 s (shardlease.calls). Five
#: fitted on a loaded machine (CI at 19a08b0); one, were the loop not retrying.
MIN_TRIES = 4


def tries_since_renewed(history: list[Seen], shard: int, fenced_at: float) -> list[Seen]:
    """The writes of `shard`'s lease that reached the proxy before `fenced_at`
    and after the last one that landed before it (answered 200): the tries of
    the renewals that ended in the fence. The last may be in flight at the
    fence (answered after it, too late to count)."""
    writes = [r for r in history if r.kind == "put-lease"
              and r.path.endswith(f"/leases/{shard}") and r.arrived <= fenced_at]
    landed = [i for i, r in enumerate(writes) if r.status == 200 and r.answered <= fenced_at]
    return writes[landed[-1] + 1:] if landed else writes


#: What the store behind the proxy may add to a request's injected latency
#: before a renewal late by it is the store's doing, not the loop's (MinIO
#: answered within 25 ms in the phases around; the slack of a renewal at
#: 0.3 x TTL is about 0.3 s).
STORE_SLACK = 0.1


def late_store(history: list[Seen], shard: int, fenced_at: float,
               latency: float) -> Seen | None:
    """The write of `shard`'s lease that was sent in time for the fence at
    `fenced_at` (answered within `latency` + STORE_SLACK it would have landed
    before it) but answered after it: the store behind the proxy, not the
    latency the proxy injected, made that renewal late. None if there is none."""
    for r in tries_since_renewed(history, shard, fenced_at):
        if r.arrived + latency + STORE_SLACK <= fenced_at < r.answered:
            return r
    return None


#: A renewal's error when its try was not answered within the budget the
#: loop gave it (shardlease.calls).
NO_ANSWER = re.compile(r"no answer within ([0-9.]+)s")


#: How soon after a fence the renewal that ended in it is reported.
REPORTED_WITHIN = 0.5


def given_time(logged: list[dict[str, Any]], shard: int, fenced_at: float,
               latency: float) -> float | None:
    """The budget of a renewal of `shard` that failed unanswered in the TTL
    before the fence at `fenced_at`, if the loop gave it time enough for the
    injected `latency` and the store's slack: the loop sent it in time, and
    what made it late lay past the loop (the proxy, the store, or the node's
    process starved of CPU). None if no such renewal failed."""
    for e in logged:
        # (The loop says a renewal failed once it gave up on it, with the
        # fence: just after it, a warm fresh-clone run at b5da602 showed.)
        if (e.get("event") == "renew_failed" and shard in e.get("shards", ())
                and fenced_at - TTL <= float(e["ts"]) <= fenced_at + REPORTED_WITHIN
                and (m := NO_ANSWER.search(str(e.get("error", ""))))
                and float(m.group(1)) >= latency + STORE_SLACK):
            return float(m.group(1))
    return None


def past_the_loop(history: list[Seen], logged: list[dict[str, Any]], fence: dict[str, Any],
                  latency: float) -> str | None:
    """Why a latency phase's fence lay past the loop, or None: each fenced
    shard's renewal was sent in time and answered late by the store, or was
    given more time than the injected latency and went unanswered."""
    at, shards = float(fence["ts"]), fence["shards"]
    lates = [late_store(history, shard, at, latency) for shard in shards]
    if all(r is not None for r in lates):
        answered = [round(r.answered - r.arrived, 2) for r in lates if r]
        return f"the store answered {answered}s after renewals sent in time"
    # (A warm fresh-clone run at d004bf8: four shards fenced at once on "no
    # answer within 1.4s" at an injected 0.9 s, the machine seen stalling
    # 0.28-0.65 s six times in that phase, none in the TTL before.) What
    # this phase checks of the loop, that it sends every renewal in time for
    # the latency, still fails a renewal sent too late: its budget is below
    # the latency.
    budgets = [given_time(logged, shard, at, latency) for shard in shards]
    if all(b is not None for b in budgets):
        return f"renewals given {budgets}s went unanswered"
    return None


def test_one_slow_node_keeps_its_shards_and_nobody_overlaps(
        minio: S3Server, make_cluster: MakeCluster, fault_proxy: MakeProxy) -> None:
    cluster, proxy, owners = one_behind_a_proxy(minio, make_cluster, fault_proxy, names=NAMES,
                                                slowed=SLOWED, shards=SHARDS, ttl=TTL)
    assert counts(owners)[SLOWED] == SHARDS // len(NAMES)

    marks: list[tuple[str, float, float, Counter[str]]] = []
    with StallWatch() as watch:
        for label, latency, errors in SLOW_PHASES:
            proxy.set(Faults(latency=latency * TTL, error_rate=errors))
            before, start = proxy.counts(), time.time()
            time.sleep(PHASE)
            marks.append((label, start, time.time(), proxy.counts() - before))
            assert cluster.running() == set(NAMES), f"a node exited during {label}"
    proxy.set(Faults())
    recovered_at, before = time.time(), proxy.counts()
    # Liveness after the fault: the slowed node gets a fair share back, open
    # on its host (the store alone may still name it for leases it fenced).
    wait_events(cluster, f"{SLOWED}'s share open again",
                lambda ev: len(open_on(ev, SLOWED)) == SHARDS // len(NAMES))
    cluster.wait_balanced("after the faults", set(NAMES))
    ended_at = time.time()

    codes = cluster.stop_all()
    assert set(codes.values()) <= {0}, codes
    with open(cluster.workdir / "proxy.jsonl", "w") as out:  # every request of the slowed node
        for seen in proxy.history():
            out.write(json.dumps(dataclasses.asdict(seen)) + "\n")
    recorded = cluster.events()
    logged = load_events([cluster.nodes[SLOWED].log])
    figures = [phase_figures(label, SLOWED, start, end, recorded, logged, requests)
               for label, start, end, requests in marks]
    figures.append(phase_figures("until balanced again", SLOWED, recovered_at, ended_at,
                                 recorded, logged, proxy.counts() - before))
    print(f"\n{SLOWED} behind the proxy; {len(NAMES)} nodes, {SHARDS} shards, "
          f"lease TTL {TTL:g}s, phases of {PHASE:g}s (files in {cluster.workdir})")
    for f in figures:
        print("  " + f.row())
        for error in f.errors:
            print(f"      renew_failed: {error}")

    # Safety over the whole run, faults included.
    report = check_events(recorded, conservative=True)
    assert report.ok, "\n".join(report.violations[:20])
    assert report.shards == SHARDS
    # A slow store costs claims, never renewals: in these phases the slowed
    # node fences nothing, loses nothing, and every shard it had stays open.
    # A store that refuses requests may refuse every try of a renewal (at 30%,
    # five tries in a row: 0.24%; a run makes about fifty renewals in that
    # phase): a fence is then the design, and allowed only after a renewal
    # of which the store refused every try, and that was tried MIN_TRIES
    # times at least (a warm CI run at 19a08b0: shard 7, five tries refused).
    # Only a stall of the machine itself (tests/support/stalls.py) within a
    # TTL before a fence excuses it (printed; cold CI run at 41c8be6: a
    # fence 0.9 s into the 503 phase, its renewal sent 0.6 s late under the
    # previous phase's 0.9 s latency, a 2.5 s deadline away).
    share = SHARDS // len(NAMES)
    history = proxy.history()
    for stall in watch.stalls:
        print(f"  the machine stalled {stall.late:.2f}s at +{stall.woke - marks[0][1]:.1f}s")
    # After an excused fence the node holds less than its share until it
    # claims again (a round or more into the next phase): what it holds at a
    # later phase's start is asserted only while no fence was excused before
    # (warm fresh-clone run at 125a7db: the 0.3 x TTL phase's fence excused by
    # stalls of the machine, then the 503 phase began with 0 of 4 held).
    excused_before = False
    for f, (label, start, end, _) in zip(figures, marks, strict=False):
        if f.label not in SLOW_KEEPS:
            continue
        assert f.lost == 0, f.row()
        if not excused_before:
            assert f.held_start == share, f.row()
        refusing = dict((p[0], p[2]) for p in SLOW_PHASES)[label] > 0
        fences = [e for e in logged if e.get("event") == "self_fence"
                  and start <= float(e["ts"]) <= end]
        excused = [e for e in fences if watch.before(float(e["ts"]), TTL)]
        for fence in excused:
            print(f"  {label}: fence of {fence['shards']} excused: the machine stalled "
                  f"{[round(s.late, 2) for s in watch.before(float(fence['ts']), TTL)]}s "
                  "in the TTL before it")
        fences = [e for e in fences if e not in excused]
        if not refusing:
            # A fence is also excused when the store itself was slow: the
            # renewal of each shard fenced reached the proxy in time and the
            # answer came back beyond the injected latency (cold CI run at
            # 46156e1: renewals sent 1.05 s before the fence, answered 1.6 s
            # later at an injected 0.9 s, every request of n1 then 0.5-0.8 s
            # over its latency while no stall of the pytest process was seen).
            latency = dict((p[0], p[1]) for p in SLOW_PHASES)[label] * TTL

            for fence in list(fences):
                if (why := past_the_loop(history, logged, fence, latency)) is not None:
                    excused.append(fence)
                    fences.remove(fence)
                    print(f"  {label}: fence of {fence['shards']} excused: {why}, at an "
                          f"injected {latency:g}s")
            assert fences == [], f"{f.row()}\n{fences}"
            if not excused and not excused_before:
                assert (f.self_fences, f.held_min, f.held_end) == (0, share, share), f.row()
            excused_before = excused_before or bool(excused)
            continue
        excused_before = excused_before or bool(excused)
        for fence in fences:
            for shard in fence["shards"]:
                tries = tries_since_renewed(history, shard, float(fence["ts"]))
                refused = [t for t in tries if t.status == 503 or t.answered > fence["ts"]]
                assert len(tries) >= MIN_TRIES and refused == tries, \
                    f"shard {shard} fenced after a renewal the store did not refuse " \
                    f"every try of, or tried fewer than {MIN_TRIES} times: {tries}\n{f.row()}"
    # The faults were really there: the proxy delayed or refused its requests.
    by_label = {f.label: f for f in figures}
    assert by_label["30% 503 SlowDown"].requests.get("slowdown", 0) > 0
    assert all(sum(f.requests.values()) > 0 for f in figures[:len(SLOW_PHASES)])


@pytest.mark.parametrize(("error", "shards", "before", "expected"), [
    ("renewal of shard 7: no answer within 1.4s", (3, 7), 1.0, 1.4),
    # sent too late for the latency: the loop's doing, never excused
    ("renewal of shard 7: no answer within 0.95s", (7,), 1.0, None),
    ("renewal of shard 7: no answer within 1.4s", (3,), 1.0, None),
    ("renewal of shard 7: no answer within 1.4s", (7,), TTL + 0.5, None),
    # reported with the fence, just after it
    ("renewal of shard 9: no answer within 1.14s", (4, 7, 9), -0.03, 1.14),
    # the next batch's retry, given what was left: not the renewal fenced
    ("renewal of shard 7: no answer within 1.4s", (7,), -1.06, None),
    ("renewal of shard 7: 503 SlowDown", (7,), 1.0, None),
])
def test_a_fence_is_put_past_the_loop_only_by_a_renewal_given_time_enough(
        error: str, shards: tuple[int, ...], before: float, expected: float | None) -> None:
    logged = [{"event": "renew_failed", "ts": 100.0 - before, "shards": list(shards),
               "error": error}]
    assert given_time(logged, 7, 100.0, 0.9) == expected
