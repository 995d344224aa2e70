"""Logging for the `shardlease` commands (node, agent, operator): text for
people, or one JSON object a line for machines (`--log-format json`).

In JSON, a record about a shard carries it as fields: `shard` and, where
known, `generation` (or `shards` for several), with `shardset` and `pod` (for
`shardlease node`: its --cluster and its --name, beside its `cluster` and
`node`). The telemetry events bring their own (`shardlease.telemetry.EventLog`);
the engine's other records name their shard in the message only
("open of shard %d failed: %s"), so the fields are read from the
placeholders of the record's format string and the arguments it was given,
never from the formatted text.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, Literal, get_args

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
DEFAULT_FORMAT: LogFormat = "text"
DEFAULT_LEVEL: LogLevel = "info"

#: Loggers kept at WARNING or above whatever the level: the S3 client logs
#: every request at DEBUG, and kopf every watch event at INFO.
QUIET = ("botocore", "aiobotocore", "urllib3", "asyncio", "kopf")

# One printf placeholder: %(key)s, flags, width, precision, length, conversion.
_PLACEHOLDER = re.compile(r"%(\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")
# The word a placeholder follows ("shard %d", "shard=%d", "(generation %d").
_BEFORE = re.compile(r"\b(shard|shards|generation)[ =]$")


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """--log-format and --log-level, the same on every long-running command."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=DEFAULT_FORMAT,
                        type=str.lower, help=f"text (for people) or json (one object a "
                        f"line, for machines); default {DEFAULT_FORMAT}")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=DEFAULT_LEVEL,
                        type=str.lower, help=f"the least severe records written; default "
                        f"{DEFAULT_LEVEL}")


def shard_fields(record: logging.LogRecord) -> dict[str, Any]:
    """`shard`, `generation` and `shards` from where the record's message
    says them; empty when the format string is not one this can follow."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not isinstance(args, tuple) or not args:
        return {}
    out: dict[str, Any] = {}
    index = 0
    for m in _PLACEHOLDER.finditer(msg):
        if m.group(4) == "%":
            continue
        if m.group(1) is not None or "*" in (m.group(2) or "") + (m.group(3) or "") \
                or index >= len(args):
            return {}  # a mapping or a * width: the arguments do not line up
        arg = args[index]
        index += 1
        word = _BEFORE.search(msg, 0, m.start())
        if word is None:
            continue
        name = word.group(1)
        if name == "shards":
            if isinstance(arg, list | tuple | set | frozenset) \
                    and all(_is_int(s) for s in arg):
                out.setdefault("shards", sorted(arg))
        elif _is_int(arg):
            out.setdefault(name, arg)
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class JsonFormatter(logging.Formatter):
    """One JSON object per record. A record's `fields` (telemetry events, or
    `extra={"fields": ...}`) come first, then what its message says of a
    shard, then `context`: the same for every record of the process (its
    shardset and pod)."""

    def __init__(self, context: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.context = dict(context or {})

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        event = getattr(record, "event", None)
        if event is not None:
            out["event"] = event
        fields = getattr(record, "fields", None)
        # (Another library's `extra` may use the name for something else.)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                out.setdefault(str(key), value)
        if record.name.startswith("shardlease"):
            for key, value in shard_fields(record).items():
                out.setdefault(key, value)
        for key, value in self.context.items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(fmt: str, level: str, *, context: Mapping[str, str] | None = None,
                  tag: str | None = None) -> None:
    """The root logger writes to stderr in `fmt`. `context`: fields of every
    JSON record; `tag`: who writes, in every text line (several nodes share
    a terminal; an agent's or the operator's logs are already its pod's)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(context))
    elif tag:
        who = tag.replace("%", "%%")
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s %(name)s [{who}] %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Python's warnings (a deprecation in a dependency) as records too: in
    # JSON, a pipeline reads every line as one object.
    logging.captureWarnings(True)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in QUIET:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
