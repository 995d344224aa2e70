"""`python -m shardlease`: the same command as `shardlease`."""

from shardlease.cli import main

raise SystemExit(main())
