"""What a node's or an agent's log says about its self-fences.

A test that waits for an owner to keep a shard must tell a failure of what it
tests from an owner that rightly fenced because the store did not answer a
renewal in time (a slow phase of the machine): the first is a bug, the second
is the design (docs/renewal.md, "Self-fencing").
"""

from __future__ import annotations

import re

_FENCE_LINE = re.compile(r"\b(self_fence|renew_failed) .*?shards=\(([\d, ]*)\)(.*)")


def fenced_unanswered(log: str) -> set[int]:
    """The shards a log says its writer fenced, each after a renewal of it
    that got no answer in time (not a refusal, nor anything else)."""
    fenced: set[int] = set()
    unanswered: set[int] = set()
    for line in log.splitlines():
        m = _FENCE_LINE.search(line)
        if m is None:
            continue
        shards = {int(x) for x in m.group(2).replace(",", " ").split()}
        if m.group(1) == "self_fence":
            fenced |= shards
        elif "no answer within" in m.group(3):
            unanswered |= shards
    return fenced & unanswered
