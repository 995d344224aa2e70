"""shardlease.proc: the process's age, read from the kernel's records."""

from __future__ import annotations

import subprocess
import sys
import time

from shardlease.proc import process_age


def test_a_process_age_counts_from_its_start_imports_included() -> None:
    # A fresh interpreter sleeps 0.3 s after its imports: its age then is at
    # least that (start-up included), and at most what the parent saw pass.
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", "import time; from shardlease.proc import process_age; "
                               "time.sleep(0.3); print(process_age())"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    elapsed = time.monotonic() - t0
    age = float(out)
    assert 0.3 <= age <= elapsed + 0.02, (age, elapsed)  # (+ one clock tick of rounding)


def test_this_process_is_older_than_zero() -> None:
    age = process_age()
    assert age is not None and age > 0
