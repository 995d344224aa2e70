"""`python -m shardlease`: the same command as `shardlease`."""

from shardlease.cli import main

if __name__ == "__main__":  # not when a spawned child re-imports the main module
    raise SystemExit(main())
