"""The HTTP host's validity calls, against a real aiohttp server on loopback:
what goes on the wire (validity_ms in the open, one POST /lease per renewal
pass, POST /shards/S/abort), and that the runner driving it never waits for a
slow or failing application's /lease."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from jsonschema import Draft202012Validator

from shardlease import conformance
from shardlease.clock import LoopClock
from shardlease.errors import HostError, OutdatedGeneration
from shardlease.hosts.base import LeasedHost, Validity
from shardlease.hosts.http import HttpHost, validity_ms
from shardlease.runner import Runner, State
from shardlease.telemetry import Event, ExtendFailed, Telemetry

SPEC = Path(__file__).parents[1] / "docs" / "host-api.yaml"


@dataclass
class App:
    """Records every request; /lease answers `lease_status` after `lease_gate`."""

    url: str = ""
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lease_status: int = 200
    #: The answer to every open: (status, JSON body); None: 200 {}.
    open_answer: tuple[int, Any] | None = None
    lease_gate: asyncio.Event | None = None
    leases_in_flight: int = 0
    max_leases_in_flight: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        self.requests.append((request.path, body))
        if request.path == "/lease":
            self.leases_in_flight += 1
            self.max_leases_in_flight = max(self.max_leases_in_flight, self.leases_in_flight)
            try:
                if self.lease_gate is not None:
                    await self.lease_gate.wait()
            finally:
                self.leases_in_flight -= 1
            return web.json_response({}, status=self.lease_status)
        if request.path.endswith("/open") and self.open_answer is not None:
            status, answer = self.open_answer
            if isinstance(answer, str):
                return web.Response(text=answer, status=status)
            return web.json_response(answer, status=status)
        return web.json_response({})

    def of(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.requests if p == path]


@pytest.fixture
async def app() -> AsyncIterator[App]:
    state = App()
    web_app = web.Application()
    web_app.router.add_post("/{tail:.*}", state.handle)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    if state.lease_gate is not None:
        state.lease_gate.set()
    await runner.cleanup()


def test_validity_is_sent_in_whole_milliseconds_rounded_down() -> None:
    assert validity_ms(1.9999) == 1999 and validity_ms(0.0004) == 0 and validity_ms(-1) == 0
    assert isinstance(HttpHost("http://x"), LeasedHost)


async def test_the_wire_format_of_open_lease_and_abort(app: App) -> None:
    host = HttpHost(app.url, open_timeout=5, close_timeout=5)
    try:
        await host.open_for(3, 7, 9.5)
        await host.extend({5: Validity(2, 1.25), 3: Validity(7, 10.0)})
        await host.abort(3, 7)
        await host.close(3)
        await host.open(4, 1)  # a plain open (a runner that keeps no deadlines)
    finally:
        await host.aclose()
    assert app.requests == [
        ("/shards/3/open", {"shard": 3, "generation": 7, "validity_ms": 9500}),
        ("/lease", {"leases": [{"shard": 3, "generation": 7, "validity_ms": 10000},
                               {"shard": 5, "generation": 2, "validity_ms": 1250}]}),
        ("/shards/3/abort", {"shard": 3, "generation": 7}),
        ("/shards/3/close", {"shard": 3, "generation": 7}),
        ("/shards/4/open", {"shard": 4, "generation": 1}),
    ]


def spec_validator(path: str, status: str | None = None) -> Draft202012Validator:
    """The JSON schema docs/host-api.yaml gives a path's request body (or,
    with `status`, the open's answer of that status), references resolved."""
    spec = yaml.safe_load(SPEC.read_text())
    post = spec["paths"][path]["post"]
    content = post["responses"][status] if status else post["requestBody"]
    schema = content["content"]["application/json"]["schema"]
    # OpenAPI 3.1 schemas are JSON Schema 2020-12: the spec is their root.
    return Draft202012Validator({**schema, "components": spec["components"]})


async def test_what_the_agent_sends_is_what_docs_host_api_yaml_says(app: App) -> None:
    host = HttpHost(app.url, open_timeout=5, close_timeout=5)
    try:
        await host.open_for(3, 7, 9.5)
        await host.open(4, 1)
        await host.extend({5: Validity(2, 1.25), 3: Validity(7, 10.0)})
        await host.abort(3, 7)
        await host.close(3)
        await host.close(6)  # never opened here: no generation to name
    finally:
        await host.aclose()
    templates = {"open": "/shards/{shard}/open", "close": "/shards/{shard}/close",
                 "abort": "/shards/{shard}/abort", "lease": "/lease"}
    for path, body in app.requests:
        template = templates[path.rsplit("/", 1)[-1]]
        errors = [e.message for e in spec_validator(template).iter_errors(body)]
        assert errors == [], (path, body, errors)
    # And the spec is no blank check: what the agent never sends is refused.
    assert not spec_validator("/shards/{shard}/open").is_valid({"shard": 1})
    assert not spec_validator("/shards/{shard}/abort").is_valid({"shard": 1, "gen": 2})
    assert not spec_validator("/lease").is_valid({"leases": [{"shard": 1, "generation": 2}]})
    # The outdated answer, as the agent reads it (hosts/http.py: outdated).
    outdated = spec_validator("/shards/{shard}/open", "409")
    assert outdated.is_valid({"error": "outdated_generation", "highest_generation": 9})
    assert not outdated.is_valid({"error": "outdated_generation"})


def test_the_spec_lists_the_rules_the_conformance_kit_checks() -> None:
    spec = yaml.safe_load(SPEC.read_text())
    assert spec["openapi"] == "3.1.0"
    assert [(r["id"], r["level"]) for r in spec["x-rules"]] \
        == [(r.id, r.level) for r in conformance.RULES]


async def test_a_refused_lease_or_abort_is_a_host_error(app: App) -> None:
    app.lease_status = 404
    host = HttpHost(app.url, abort_timeout=5)
    try:
        with pytest.raises(HostError, match="404"):
            await host.extend({1: Validity(1, 1.0)})
    finally:
        await host.aclose()
    nowhere = HttpHost("http://127.0.0.1:9", abort_timeout=5)  # the discard port: refused
    try:
        with pytest.raises(HostError, match="abort shard 1"):
            await nowhere.abort(1, 1)
    finally:
        await nowhere.aclose()


def runner_for(host: HttpHost, events: list[Event], **kwargs: Any) -> Runner:
    telemetry = Telemetry()
    telemetry.subscribe(events.append)
    return Runner(host, cluster="c", node="n", clock=LoopClock(), telemetry=telemetry,
                  **kwargs)


async def wait_until(what: str, check: Any, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < end, f"not {what}"
        await asyncio.sleep(0.01)


async def test_one_lease_per_pass_one_in_flight_and_never_in_the_way_of_renewals(
        app: App) -> None:
    """A runner on a real loop: the renewals of a pass reach the app as one
    POST /lease; while a /lease hangs, more passes join into one next call,
    the deadlines keep moving, and the shards stay open."""
    events: list[Event] = []
    host = HttpHost(app.url, open_timeout=5, close_timeout=5)
    runner = runner_for(host, events, extend_timeout=30.0)
    task = asyncio.create_task(runner.run())
    loop = asyncio.get_running_loop()
    try:
        for s in range(3):
            runner.start(s, 10 + s, deadline=loop.time() + 60)
        await wait_until("open", lambda: all(runner.state(s) is State.OPEN for s in range(3)))
        opens = app.of("/shards/0/open")
        assert len(opens) == 1 and 59_000 < opens[0]["validity_ms"] <= 60_000, opens
        app.lease_gate = gate = asyncio.Event()
        for s in range(3):
            runner.extend(s, loop.time() + 70)
        runner.flush()
        await wait_until("the first /lease arrives", lambda: len(app.of("/lease")) == 1)
        first = app.of("/lease")[0]["leases"]
        assert [(e["shard"], e["generation"]) for e in first] == [(0, 10), (1, 11), (2, 12)]
        for extra in (71, 72):  # two more passes while it hangs
            runner.extend(1, loop.time() + extra)
            runner.flush()
            await asyncio.sleep(0.05)
        assert len(app.of("/lease")) == 1 and runner.deadline(1) is not None
        gate.set()
        await wait_until("the joined /lease arrives", lambda: len(app.of("/lease")) == 2)
        second = app.of("/lease")[1]["leases"]
        assert [(e["shard"], e["generation"]) for e in second] == [(1, 11)]
        assert 71_000 < second[0]["validity_ms"] <= 72_000
        assert app.max_leases_in_flight == 1
        # A failing application: counted, not fatal.
        app.lease_status = 503
        runner.extend(2, loop.time() + 80)
        runner.flush()
        await wait_until("reported", lambda: any(isinstance(e, ExtendFailed) for e in events))
        assert runner.running and all(runner.state(s) is State.OPEN for s in range(3))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await host.aclose()
    # Cancelled: every shard closed (concurrently), with its generation.
    closes = sorted((p, b["generation"]) for p, b in app.requests if p.endswith("/close"))
    assert closes == [(f"/shards/{s}/close", 10 + s) for s in range(3)]


async def test_an_open_refused_for_a_newer_generation_says_which(app: App) -> None:
    host = HttpHost(app.url, open_timeout=5, close_timeout=5)
    try:
        for highest in (7, 3):  # above the one asked, or the same one opened elsewhere
            app.open_answer = (409, {"error": "outdated_generation", "highest_generation": highest})
            with pytest.raises(OutdatedGeneration) as refused:
                await host.open_for(2, 3, 5.0)
            assert (refused.value.shard, refused.value.generation, refused.value.highest) \
                == (2, 3, highest)
            assert f"has seen generation {highest}" in str(refused.value)
    finally:
        await host.aclose()


@pytest.mark.parametrize("status,answer", [
    (409, {"error": "fenced"}),  # no generation named
    (409, {"highest_generation": 2}),  # below the one asked: no reason to claim above it
    (409, {"highest_generation": "9"}),  # not an integer
    (409, {"highest_generation": True}),
    (409, {"highest_generation": 2**63 - 1}),  # nothing could be claimed above it
    (409, "not json"),
    (409, ["highest_generation", 9]),
    (500, {"highest_generation": 9}),  # only a 409 says it
])
async def test_any_other_refusal_is_an_ordinary_failed_open(app: App, status: int,
                                                            answer: Any) -> None:
    host = HttpHost(app.url, open_timeout=5, close_timeout=5)
    app.open_answer = (status, answer)
    try:
        with pytest.raises(HostError) as refused:
            await host.open_for(2, 3, 5.0)
        assert not isinstance(refused.value, OutdatedGeneration)
        assert f"answered {status}" in str(refused.value)
    finally:
        await host.aclose()
