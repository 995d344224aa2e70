"""`shardlease bench`: figures for the README (not a test). Being written."""

from __future__ import annotations

import argparse


def cmd_bench(args: argparse.Namespace) -> int:
    print("bench: not yet written")
    return 1
