"""`shardlease conformance URL`: drive a running application through the
rules of the host protocol (docs/host-api.yaml, shardlease.hosts.http) and
say which it breaks.

Each check uses one shard (`--shard`, 0 by default) and generations of its
own, above `--generation` (by default the seconds since 1970, so that a
second run goes above the first): an application that keeps the generation
in its storage is left at that generation, which the agent then claims above
(the outdated answer). Run it against a test instance, not one serving
traffic: it opens and closes that shard.

Every check is black-box, through the protocol alone: a rule the protocol
cannot show from outside (the validity deadline, that storage refuses an
older writer) is the example application's to show (examples/).

A rule is a MUST (breaking it can let two writers act, or leaves shards
stuck) or a SHOULD (the agent copes, at a cost). The command exits 1 if any
MUST is broken, else 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from shardlease.errors import ShardleaseError

#: Seconds one call may take before the check fails.
CALL_TIMEOUT = 10.0
#: The generation band of each check: check k uses base + STEP * k + 0..STEP-1.
STEP = 10

Level = Literal["MUST", "SHOULD"]


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer
    body: Any
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def __str__(self) -> str:
        if self.status == 0:
            return f"no answer ({self.text})"
        return f"{self.status} {' '.join(self.text.split())[:120]}"


@dataclass(frozen=True)
class Finding:
    rule: str  # the id in docs/host-api.yaml's x-rules
    level: Level
    passed: bool
    message: str


class Broken(ShardleaseError):
    """A rule broken: the message says what was sent and what came back
    (caught by `run`, which turns it into a finding)."""

    def __init__(self, message: str, level: Level | None = None) -> None:
        super().__init__(message)
        self.level = level


class App:
    """The application's protocol endpoints, one call at a time."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session

    async def post(self, path: str, body: Any) -> Answer:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            async with self.session.post(
                    f"{self.base_url}{path}", data=raw,
                    headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT)) as resp:
                text = await resp.text()
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = None
                return Answer(resp.status, parsed, text)
        except (aiohttp.ClientError, TimeoutError) as e:
            return Answer(0, None, repr(e))

    async def open(self, shard: int, generation: int, validity_ms: int = 60_000) -> Answer:
        return await self.post(f"/shards/{shard}/open", {
            "shard": shard, "generation": generation, "validity_ms": validity_ms})

    async def close(self, shard: int, generation: int) -> Answer:
        return await self.post(f"/shards/{shard}/close", {"shard": shard,
                                                          "generation": generation})

    async def abort(self, shard: int, generation: int) -> Answer:
        return await self.post(f"/shards/{shard}/abort", {"shard": shard,
                                                          "generation": generation})

    async def lease(self, entries: list[tuple[int, int, int]]) -> Answer:
        return await self.post("/lease", {"leases": [
            {"shard": s, "generation": g, "validity_ms": v} for s, g, v in entries]})


def expect_ok(what: str, answer: Answer) -> None:
    if not answer.ok:
        raise Broken(f"{what}: expected a 2xx answer, got {answer}")


def expect_refused(what: str, answer: Answer) -> None:
    if answer.ok:
        raise Broken(f"{what}: expected a refusal (not 2xx), got {answer}")
    if answer.status == 0:
        raise Broken(f"{what}: expected a refusal, got {answer}")


def outdated_problem(answer: Answer, at_least: int) -> str | None:
    """Why a refusal is not the protocol's outdated answer (None: it is)."""
    body = answer.body
    highest = body.get("highest_generation") if isinstance(body, dict) else None
    if answer.status != 409:
        return f"answered {answer.status}, not 409"
    if not isinstance(highest, int) or isinstance(highest, bool):
        return "its JSON has no integer highest_generation"
    if highest < at_least:
        return f"highest_generation {highest} is below {at_least}, the highest it opened"
    return None


Check = Callable[[App, int, int], Awaitable[None]]


@dataclass(frozen=True)
class Rule:
    id: str
    level: Level
    says: str
    check: Check


async def open_then_again(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_ok(f"the same open again (a retry of open {g})", await app.open(shard, g))
    expect_ok(f"close of generation {g}", await app.close(shard, g))
    expect_ok(f"the same close again (a retry of close {g})", await app.close(shard, g))


async def lease_entries(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_ok(f"/lease of the open generation {g}", await app.lease([(shard, g, 30_000)]))
    expect_ok(f"/lease naming generation {g - 1}, not the one open (to be ignored)",
              await app.lease([(shard, g - 1, 30_000)]))
    expect_ok(f"/lease naming generation {g + 1}, not opened yet (to be ignored)",
              await app.lease([(shard, g + 1, 30_000)]))
    expect_ok(f"close of generation {g}", await app.close(shard, g))


async def closed_generation_refused(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_ok(f"close of generation {g}", await app.close(shard, g))
    expect_refused(f"an open of generation {g} after its close (a late open)",
                   await app.open(shard, g))


async def still_open(app: App, shard: int, g: int, after: str, meaning: str = "") -> None:
    """Generation g is still open after `after`: its open again is a retry
    (2xx); had it been closed, the open of a closed generation would be
    refused. Then close it."""
    answer = await app.open(shard, g)
    if not answer.ok:
        raise Broken(f"after {after}, generation {g} is no longer open (its open again "
                     f"answered {answer}){': ' + meaning if meaning else ''}")
    expect_ok(f"close of generation {g}", await app.close(shard, g))


async def older_close_ignored(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_ok(f"close of generation {g - 1}, older than the one open (to be ignored)",
              await app.close(shard, g - 1))
    await still_open(app, shard, g, f"a close of generation {g - 1}",
                     "an older close closed a newer open")


async def older_open_refused(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_refused(f"an open of generation {g - 1} while {g} is open",
                   await app.open(shard, g - 1))
    await still_open(app, shard, g, f"a refused open of generation {g - 1}")


async def outdated_answer(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    answer = await app.open(shard, g - 1)
    expect_refused(f"an open of generation {g - 1} while {g} is open", answer)
    if (why := outdated_problem(answer, g)) is not None:
        raise Broken(f"an open of generation {g - 1} after {g} was refused, but not as "
                     f"outdated ({why}): the agent takes it for a failing application and "
                     f"retries one generation at a time, with cooldowns")
    expect_ok(f"close of generation {g}", await app.close(shard, g))
    answer = await app.open(shard, g)
    if answer.ok:
        raise Broken(f"an open of generation {g} after its close was accepted", "MUST")
    if (why := outdated_problem(answer, g)) is not None:
        raise Broken(f"an open of generation {g} after its close was refused, but not as "
                     f"outdated ({why})")


async def abort_drops(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_ok(f"abort of generation {g}", await app.abort(shard, g))
    expect_refused(f"an open of generation {g} after its abort (the abort closed it)",
                   await app.open(shard, g))


async def older_abort_ignored(app: App, shard: int, g: int) -> None:
    expect_ok(f"open shard {shard} at generation {g}", await app.open(shard, g))
    expect_ok(f"abort of generation {g - 1}, older than the one open (to be ignored)",
              await app.abort(shard, g - 1))
    await still_open(app, shard, g, f"an abort of generation {g - 1}",
                     "an older abort dropped a newer open")


async def bad_requests(app: App, shard: int, g: int) -> None:
    cases: list[tuple[str, str, Any]] = [
        ("an open without a generation", f"/shards/{shard}/open", {"shard": shard}),
        ("an open whose body is not JSON", f"/shards/{shard}/open", b"{not json"),
        ("an open with a generation that is no integer", f"/shards/{shard}/open",
         {"shard": shard, "generation": "seven"}),
        ("an open naming another shard than its path", f"/shards/{shard}/open",
         {"shard": shard + 1, "generation": g}),
        ("a /lease whose leases is no list", "/lease", {"leases": "all"}),
    ]
    for what, path, body in cases:
        answer = await app.post(path, body)
        if answer.ok or answer.status == 0:
            raise Broken(f"{what}: expected a 4xx refusal, got {answer}", "MUST")
        if not 400 <= answer.status < 500:
            raise Broken(f"{what}: expected a 4xx refusal, got {answer}")


RULES: tuple[Rule, ...] = (
    Rule("idempotent", "MUST", "open and close are idempotent per (shard, generation)",
         open_then_again),
    Rule("lease-names-its-generation", "MUST",
         "/lease is accepted, and an entry for a generation other than the one open is ignored",
         lease_entries),
    Rule("closed-generation-refused", "MUST",
         "an open of a generation already closed is refused (a late open)",
         closed_generation_refused),
    Rule("older-close-ignored", "MUST",
         "a close older than the generation open is ignored", older_close_ignored),
    Rule("older-open-refused", "MUST",
         "an open older than the generation open is refused, and leaves it open",
         older_open_refused),
    Rule("outdated-answer", "SHOULD",
         "such refusals are 409 with highest_generation at or above the one seen",
         outdated_answer),
    Rule("abort-drops", "SHOULD", "an abort drops the shard: its generation counts as closed",
         abort_drops),
    Rule("older-abort-ignored", "MUST",
         "an abort older than the generation open is ignored", older_abort_ignored),
    Rule("bad-requests-4xx", "SHOULD",
         "a malformed call is refused with 4xx (never accepted)", bad_requests),
)


async def run(base_url: str, *, shard: int = 0, generation: int | None = None,
              rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """Every rule, in order, each on its own generations; a finding per rule."""
    base = generation if generation is not None else int(time.time())
    findings = []
    async with aiohttp.ClientSession() as session:
        app = App(base_url, session)
        for k, rule in enumerate(rules):
            try:
                await rule.check(app, shard, base + STEP * (k + 1))
            except Broken as e:
                findings.append(Finding(rule.id, e.level or rule.level, False, str(e)))
            else:
                findings.append(Finding(rule.id, rule.level, True, rule.says))
    return findings


def report(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        mark = "ok  " if f.passed else ("FAIL" if f.level == "MUST" else "WARN")
        lines.append(f"{mark} {f.level:<6} {f.rule}: {f.message}")
    broken = [f for f in findings if not f.passed and f.level == "MUST"]
    warned = [f for f in findings if not f.passed and f.level == "SHOULD"]
    lines.append(f"conformance: {len(findings) - len(broken) - len(warned)} rules kept, "
                 f"{len(broken)} broken (MUST), {len(warned)} warned (SHOULD)")
    return "\n".join(lines)
