"""The stall watch of the tests (tests/support/stalls.py): a stall is seen,
and only one near a moment excuses what happened then."""

from __future__ import annotations

import time

from tests.support.stalls import Stall, StallWatch


def test_only_a_stall_in_the_window_before_a_moment_counts() -> None:
    watch = StallWatch(tick=0.05)
    watch.stalls = [Stall(woke=100.0, late=0.6), Stall(woke=110.0, late=0.3)]
    assert watch.before(100.5, 3.0) == [watch.stalls[0]]
    assert watch.before(103.0, 3.0) == [watch.stalls[0]]
    assert watch.before(103.1, 3.0) == []
    # The stall may still be going on at the moment (it ends after it).
    assert watch.before(99.8, 3.0) == [watch.stalls[0]]
    assert watch.before(99.0, 3.0) == []
    assert watch.before(112.0, 3.0) == [watch.stalls[1]]


def test_a_process_that_stops_running_python_is_a_stall() -> None:
    # sum() over a range runs in C and keeps the interpreter's lock: the
    # watch's thread cannot wake until it ends.
    with StallWatch(tick=0.01, threshold=0.1) as watch:
        time.sleep(0.05)
        began = time.perf_counter()
        n = 10**6
        while time.perf_counter() - began < 0.3:
            sum(range(n))
            n *= 2
        time.sleep(0.1)
    assert watch.stalls, "no stall seen"
    assert all(s.late > 0.1 for s in watch.stalls)
