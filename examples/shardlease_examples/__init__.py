"""Example applications driven by shardlease.

- `shardlease_examples.shardapp`: a sharded key-value service that speaks the
  sidecar's HTTP host protocol and keeps each shard in one S3 object, fenced
  by the lease generation (run it with ``python -m shardlease_examples.shardapp``).
"""
