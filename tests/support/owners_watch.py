"""The owners as a user watches them: one `shardlease owners -o json --watch`
process per cluster, read line by line.

Polling `shardlease owners` once per check started a Python process each
time (about 0.65 s of CPU), several times a second, for the whole of every
wait: on a 2-core machine that starved the very nodes and S3 server under
test. One watching process reads the store every `every` seconds instead;
`read()` returns the first read that began after it was called, so a check
never sees a view older than itself, as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

Owners = list[dict[str, Any]]


class OwnersWatch:
    def __init__(self, store: str, cluster: str, shards: int, *, every: float = 0.25,
                 env: Mapping[str, str] | None = None, timeout: float = 90.0) -> None:
        self.store, self.shards, self.timeout = store, shards, timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardlease", "owners", "--store", store,
             "--cluster", cluster, "--shards", str(shards), "-o", "json",
             "--watch", f"{every:g}", "--parent-pid", str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=dict(env) if env is not None else None)
        self._cond = threading.Condition()
        #: Reads finished (good or failed), and the last one's result:
        #: the shards, or the error lines of a failed read.
        self._reads = 0
        self._last: Owners | list[str] = []
        self._errors: list[str] = []
        self._reader = threading.Thread(target=self._read_lines, daemon=True)
        self._reader.start()

    def _read_lines(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self._cond:
                if line.startswith("{"):
                    doc = json.loads(line)
                    self._last, self._errors = doc["shards"], []
                    self._reads += 1
                elif "read again" in line:
                    self._last, self._errors = list(self._errors), []
                    self._reads += 1
                else:
                    self._errors.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def read(self) -> Owners:
        """The owners from a read that began after this call."""
        end = time.monotonic() + self.timeout
        with self._cond:
            # The read in progress may have begun before the call: the one after it.
            want = self._reads + 2
            while self._reads < want:
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"shardlease owners --watch exited with "
                                         f"{self.proc.returncode}: {self._errors}")
                if not self._cond.wait(timeout=max(0.0, end - time.monotonic())):
                    raise AssertionError(f"shardlease owners --watch read nothing in "
                                         f"{self.timeout:g}s")
            last = self._last
        if last and isinstance(last[0], str):
            errors = "\n".join(str(e) for e in last)
            if "does not exist" in errors:
                # A file store is made by the first node's first write: until
                # then `owners` says it does not exist, and nobody owns anything.
                return [{"shard": s, "owner": None, "generation": 0} for s in range(self.shards)]
            raise AssertionError(f"shardlease owners on {self.store} failed: {errors}")
        shards: Owners = [dict(row) for row in last if isinstance(row, dict)]
        assert [s["shard"] for s in shards] == list(range(self.shards)), shards
        return shards

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
