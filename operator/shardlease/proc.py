"""Facts of this process that the operating system keeps."""

from __future__ import annotations

import os
import time

__all__ = ["process_age"]


def process_age() -> float | None:
    """Seconds since this process started (Linux: its start time in
    /proc/self/stat against CLOCK_BOOTTIME, the clock the kernel counts it
    on), or None where that cannot be read. Interpreter start-up and imports
    included, which a clock read in `main()` would miss."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        # The command name (field 2) is in parentheses and may hold spaces.
        fields = stat[stat.rindex(")") + 2:].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
