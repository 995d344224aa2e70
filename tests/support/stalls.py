"""A watch for the moments this machine stopped running the tests.

A 2-core machine running four test groups, a kind cluster and the control
planes at once sometimes stops a process for half a second or more: a whole
machine's stall (every test process late at once), or a full garbage
collection of a large pytest process (whose threads, such as a fault proxy's,
stop with it). A liveness figure measured at a lease TTL of 3 s cannot hold
through that, and a test that asserts one says so instead of failing: it asks
the watch whether a stall came just before what it saw.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Stall:
    woke: float  # wall time
    late: float  # seconds


@dataclass
class StallWatch:
    """Sleeps `tick` at a time in a thread; a wake more than `threshold`
    late is a stall. ``with StallWatch() as watch: ...``."""

    tick: float = 0.05
    threshold: float = 0.25
    stalls: list[Stall] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            time.sleep(self.tick)
            late = time.perf_counter() - began - self.tick
            if late > self.threshold:
                self.stalls.append(Stall(time.time(), late))

    def __enter__(self) -> StallWatch:
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def before(self, t: float, within: float) -> list[Stall]:
        """The stalls that ended in the `within` seconds up to wall time `t`
        (or overlapped it)."""
        return [s for s in self.stalls if t - within <= s.woke <= t + s.late + self.tick]
