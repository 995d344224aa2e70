"""Logs for people and for machines (#43 item 3): the --log-format and
--log-level options of the three long-running commands, what a JSON record
carries about its shard, and the generation the event log remembers for the
events that do not name it. The records of a real agent are in
tests/k8s/test_agent_logs.py."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest

from shardlease.cli import build_parser
from shardlease.errors import ConfigError
from shardlease.k8s.inject import AgentConfig, inject
from shardlease.logs import JsonFormatter, setup_logging, shard_fields
from shardlease.telemetry import (
    Claim,
    Closed,
    EventLog,
    LeftToExpire,
    Lost,
    Opened,
    Release,
    SelfFence,
)

COMMANDS = {
    "node": ["node", "--store", "memory://x", "--cluster", "c", "--name", "a", "--shards", "2"],
    "agent": ["agent", "--shardset", "db", "--name", "db-0", "--namespace", "ns"],
    "operator": ["operator", "--agent-image", "x"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("option", "value", "choices"), [
    ("--log-format", "xml", "'text', 'json'"),
    ("--log-level", "loud", "'debug', 'info', 'warning', 'error'"),
    ("--log-level", "", "'debug', 'info', 'warning', 'error'"),
])
def test_a_bad_log_option_is_refused_in_one_line_naming_the_choices(
        capsys: pytest.CaptureFixture[str], command: str, option: str, value: str,
        choices: str) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*COMMANDS[command], option, value])
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"shardlease {command}: error: argument {option}: invalid choice: "
                           f"{value!r}"), line
    assert f"(choose from {choices})" in line, line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_log_options_default_to_text_and_info_and_take_any_case(command: str) -> None:
    args = build_parser().parse_args(COMMANDS[command])
    assert (args.log_format, args.log_level) == ("text", "info")
    args = build_parser().parse_args([*COMMANDS[command], "--log-format", "JSON",
                                      "--log-level", "Warning"])
    assert (args.log_format, args.log_level) == ("json", "warning")


def test_the_injected_agents_arguments_are_the_agent_commands_own() -> None:
    config = AgentConfig.model_validate({"logFormat": "json", "logLevel": "debug"})
    pod = {"metadata": {"name": "db-0"}, "spec": {"containers": [{"name": "app"}]}}
    (agent,) = inject(pod, "shardlease:1", "db", config=config)["spec"]["initContainers"]
    args = build_parser().parse_args(agent["args"])
    assert (args.command, args.shardset) == ("agent", "db")
    assert (args.log_format, args.log_level) == ("json", "debug")


@pytest.mark.parametrize(("config", "words"), [
    ('{"logFormat": "xml"}', ["logFormat", "'text' or 'json'"]),
    ('{"logLevel": "verbose"}', ["logLevel", "'debug', 'info', 'warning' or 'error'"]),
])
def test_a_bad_log_value_in_the_agent_config_is_refused_with_a_message_naming_it(
        config: str, words: list[str]) -> None:
    from shardlease.k8s.commands import run_operator

    args = build_parser().parse_args([*COMMANDS["operator"], "--agent-config", config])
    with pytest.raises(ConfigError) as e:
        run_operator(args)
    assert str(e.value).startswith("--agent-config (SHARDLEASE_AGENT_CONFIG): ")
    for word in words:
        assert word in str(e.value)


def record(msg: str, *args: object, name: str = "shardlease.runner") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


@pytest.mark.parametrize(("msg", "args", "fields"), [
    # The engine's own lines (runner.py, keeper.py, loop.py, hosts/log.py).
    ("open of shard %d failed: %s", (3, "boom"), {"shard": 3}),
    ("could not tell the host to abort shard %d (generation %d): %s", (3, 7, "x"),
     {"shard": 3, "generation": 7}),
    ("shard %d: its lease record was %s by another writer", (5, "replaced"), {"shard": 5}),
    ("self-fencing shards %s: no renewal before their deadline", ([4, 1],),
     {"shards": [1, 4]}),
    ("open shard=%d generation=%d node=%s", (2, 9, "a"), {"shard": 2, "generation": 9}),
    ("close of fenced shard %d did not end before its lease could be taken (%.3gs after the "
     "deadline)", (6, 2.5), {"shard": 6}),
    # A count of shards is not a shard; a %% is no placeholder.
    ("renewal failed for %d shard(s): %s", (4, "x"), {}),
    ("100%% of shard %d", (8,), {"shard": 8}),
    # What cannot be followed gives nothing rather than a wrong shard.
    ("shard %*d of %d", (3, 1, 2), {}),
    ("shard %d", ("three",), {}),
    ("shard %d", (True,), {}),
    ("shards %s", (["a"],), {}),
    ("shard %d and %d", (1,), {}),
    ("no arguments, shard 3", (), {}),
])
def test_a_records_shard_comes_from_its_format_strings_arguments(
        msg: str, args: tuple[object, ...], fields: dict[str, object]) -> None:
    assert shard_fields(record(msg, *args)) == fields


def test_a_json_record_has_its_fields_then_its_message_shard_then_the_context() -> None:
    fmt = JsonFormatter({"shardset": "db", "pod": "db-0", "shard": "never"})
    out = json.loads(fmt.format(record("open of shard %d failed: %s", 3, "boom")))
    assert out == {"ts": out["ts"], "level": "warning", "logger": "shardlease.runner",
                   "msg": "open of shard 3 failed: boom", "shard": 3, "shardset": "db",
                   "pod": "db-0"}
    # A record's own fields (an event's) win over what the message or context say.
    rec = record("open of shard %d", 3, name="shardlease")
    rec.event = "opened"
    rec.fields = {"shard": 4, "generation": 2, "pod": "db-1"}
    out = json.loads(fmt.format(rec))
    assert (out["event"], out["shard"], out["generation"], out["pod"], out["shardset"]) == \
        ("opened", 4, 2, "db-1", "db")
    # Other libraries' messages are not read for shards, nor their `fields`
    # taken for ours unless they are a mapping.
    rec = record("shard %d", 3, name="kopf.objects")
    rec.fields = ["not", "ours"]
    out = json.loads(fmt.format(rec))
    assert out["shard"] == "never" and "not" not in out


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged() -> Iterator[list[logging.LogRecord]]:
    handler = Records()
    log = logging.getLogger("shardlease")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def test_the_event_log_gives_the_generation_held_to_the_events_without_it(
        logged: list[logging.LogRecord]) -> None:
    log = EventLog()
    who = {"cluster": "db", "node": "db-0"}
    for event in [
        Claim(**who, shard=0, generation=4), Opened(**who, shard=0, generation=4, deadline=1.0,
                                                    deadline_wall=1.0),
        Claim(**who, shard=1, generation=9),
        # Another node of the same process: its own table.
        Claim(cluster="db", node="db-1", shard=0, generation=5),
        SelfFence(**who, shards=(0, 1)),
        Closed(**who, shard=0, reason="fenced"),
        Closed(**who, shard=1, reason="open_failed"),  # never opened: the claim's
        LeftToExpire(**who, shard=0, left=1.0),
        Release(**who, shard=0), Release(**who, shard=1),
        Release(**who, shard=0),  # freed again: no claim since, nothing known
        Claim(**who, shard=2, generation=3), Lost(**who, shard=2),
        Release(cluster="db", node="db-1", shard=0),
    ]:
        log(event)
    got = [(r.event, r.fields.get("shard"), r.fields.get("generation"),  # type: ignore[attr-defined]
            r.fields.get("generations"), r.fields["shardset"], r.fields["pod"])  # type: ignore[attr-defined]
           for r in logged]
    assert got == [
        ("claim", 0, 4, None, "db", "db-0"), ("opened", 0, 4, None, "db", "db-0"),
        ("claim", 1, 9, None, "db", "db-0"), ("claim", 0, 5, None, "db", "db-1"),
        ("self_fence", None, None, [4, 9], "db", "db-0"),
        ("closed", 0, 4, None, "db", "db-0"), ("closed", 1, 9, None, "db", "db-0"),
        ("left_to_expire", 0, 4, None, "db", "db-0"),
        ("release", 0, 4, None, "db", "db-0"), ("release", 1, 9, None, "db", "db-0"),
        ("release", 0, None, None, "db", "db-0"),
        ("claim", 2, 3, None, "db", "db-0"), ("lost", 2, 3, None, "db", "db-0"),
        ("release", 0, 5, None, "db", "db-1"),
    ]
    # People read the event's own fields, as before.
    assert logged[5].getMessage() == "closed cluster=db node=db-0 shard=0 reason=fenced"


@pytest.fixture
def fresh_logging() -> Iterator[None]:
    """setup_logging changes the process's logging: put it back."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in ("botocore", "kopf")}
    # An earlier test that ran the CLI in this process left the capture on,
    # holding the showwarning pytest had then: captureWarnings(True) would
    # keep that one (the rest group's order, tests/test_cli.py first).
    logging.captureWarnings(False)
    try:
        yield
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        for name, was in quiet.items():
            logging.getLogger(name).setLevel(was)
        logging.captureWarnings(False)


@pytest.mark.usefixtures("fresh_logging")
def test_setup_writes_json_lines_keeps_the_chatty_libraries_quiet_and_takes_warnings(
        capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("json", "error", context={"shardset": "db", "pod": "db-0"})
    assert logging.getLogger("botocore").getEffectiveLevel() == logging.ERROR
    assert logging.getLogger("kopf").getEffectiveLevel() == logging.ERROR
    logging.getLogger("shardlease.loop").warning("not written at error")
    logging.getLogger("shardlease.runner").error("giving up closing fenced shard %d", 3)
    setup_logging("json", "warning", context={"shardset": "db", "pod": "db-0"})
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a dependency's", UserWarning, stacklevel=1)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(r["logger"], r.get("shard"), r["shardset"]) for r in lines] == [
        ("shardlease.runner", 3, "db"), ("py.warnings", None, "db")]

    setup_logging("text", "info")
    assert logging.getLogger("kopf").getEffectiveLevel() == logging.WARNING
    logging.getLogger("shardlease.agent").info("ready")
    assert capsys.readouterr().err.rstrip().endswith(" INFO shardlease.agent: ready")
    setup_logging("text", "debug", tag="a%b")
    logging.getLogger("shardlease.cli").debug("node stopped")
    assert capsys.readouterr().err.rstrip().endswith(" DEBUG shardlease.cli [a%b] node stopped")
