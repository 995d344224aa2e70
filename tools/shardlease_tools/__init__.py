"""shardlease's development tools: the benchmark (`shardlease bench`) and the
fault-injecting S3 proxy. A distribution of its own (tools/pyproject.toml),
so that the production wheel, the image and every agent sidecar carry none
of it; nothing in `shardlease` imports it but the `bench` subcommand, which
says how to install it when it is missing."""
