"""Time, injected.

The loop and the runner read time only from a `Clock`. The default reads the
running event loop's clock (monotonic) so that a virtual-time event loop runs
the real code in simulated time, as kopf's tests do with looptime.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; deadlines and expiry use it."""

    def wall(self) -> float:
        """Seconds since the epoch; written into records for people, never
        compared across nodes (their clocks may be skewed)."""


class LoopClock:
    """Monotonic time from the running event loop, wall time from the OS,
    optionally skewed (simulations of nodes whose clocks disagree)."""

    def __init__(self, wall_skew: float = 0.0) -> None:
        self.wall_skew = wall_skew

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        return time.time() + self.wall_skew
