"""`shardlease conformance URL`, as typed, against the example application
(a real process on moto's S3: it keeps every rule) and against applications
made wrong on purpose here (each breaks a rule it names, and the kit says so
in words).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from shardlease.conformance import RULES
from tests.support.s3server import S3Server

from .fleet import Fleet

pytest_plugins = ["tests.support.s3server"]


async def conformance(url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shardlease", "conformance", url, *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_example_application_keeps_every_rule(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, s3_server.url(s3_bucket, "conf"), "memory://unused", 4)
    try:
        url = fleet.start_app("a")

        async with aiohttp.ClientSession() as http:
            await fleet.apps_serving(http)
        code, out, err = await conformance(url, "--shard", "2")
        assert code == 0, out + err
        assert f"conformance: {len(RULES)} rules kept, 0 broken (MUST), 0 warned" in out, out
        code, out, err = await conformance(url, "--shard", "3", "-o", "json")
        assert code == 0, out + err
        findings = json.loads(out)["findings"]
        assert [f["rule"] for f in findings] == [r.id for r in RULES]
        assert all(f["passed"] for f in findings), findings
    finally:
        fleet.cleanup()


class WrongApp:
    """A host protocol server with chosen faults: `stateless` accepts every
    call (no memory of generations); `close_any` keeps generations, but a
    close of any generation closes the shard; `plain_409` refuses as it
    should, without saying the highest generation."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.open: dict[int, int] = {}
        self.closed: dict[int, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        if self.fault == "stateless":
            return web.json_response({})
        try:
            body = await request.json()
            generation = body["generation"] if request.path != "/lease" else 0
            shard = int(request.match_info.get("shard", "0"))
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "bad_request"}, status=400)
        action = request.path.rsplit("/", 1)[-1]
        if action == "lease":
            return web.json_response({})
        if action == "open":
            seen = max(self.open.get(shard, -1), self.closed.get(shard, -1))
            if generation < self.open.get(shard, -1) or generation <= self.closed.get(shard, -1):
                answer: dict[str, Any] = {"error": "refused"}
                if self.fault != "plain_409":
                    answer["highest_generation"] = seen
                return web.json_response(answer, status=409)
            self.open[shard] = generation
            return web.json_response({})
        held = self.open.get(shard)
        if held is not None and (self.fault == "close_any" or generation >= held):
            self.closed[shard] = max(held, self.closed.get(shard, -1))
            del self.open[shard]
        return web.json_response({})


@pytest.fixture
async def wrong_app() -> AsyncIterator[Callable[[str], Any]]:
    runners: list[web.AppRunner] = []

    async def start(fault: str) -> str:
        app = web.Application()
        state = WrongApp(fault)
        app.router.add_post("/shards/{shard}/{action}", state.handle)
        app.router.add_post("/lease", state.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.mark.parametrize(("fault", "code", "broken", "says"), [
    ("stateless", 1, {"closed-generation-refused": "FAIL", "older-open-refused": "FAIL",
                      "outdated-answer": "WARN", "abort-drops": "WARN",
                      "bad-requests-4xx": "FAIL"},
     "an open of generation"),
    ("close_any", 1, {"older-close-ignored": "FAIL", "older-abort-ignored": "FAIL",
                      "bad-requests-4xx": "WARN"},
     "an older close closed a newer open"),
    ("plain_409", 0, {"outdated-answer": "WARN", "bad-requests-4xx": "WARN"},
     "no integer highest_generation"),
])
async def test_a_wrong_application_is_told_which_rules_it_breaks(
        wrong_app: Callable[[str], Any], fault: str, code: int, broken: dict[str, str],
        says: str) -> None:
    url = await wrong_app(fault)
    got, out, err = await conformance(url, "--generation", "100")
    assert got == code, out + err
    marks = {line.split()[2].rstrip(":"): line.split()[0] for line in out.splitlines()
             if line.split() and line.split()[0] in ("ok", "FAIL", "WARN")}
    assert {rule: mark for rule, mark in marks.items() if mark != "ok"} == broken, out
    assert says in out, out
    assert "Traceback" not in err


async def test_an_application_not_there_fails_every_rule_in_words() -> None:
    code, out, err = await conformance("http://127.0.0.1:9", "--generation", "5")
    assert code == 1, out + err
    assert "no answer" in out and "Traceback" not in err


@pytest.mark.parametrize(("args", "words"), [
    (["ftp://x"], "http://"),
    (["http://127.0.0.1:9", "--shard", "-1"], "--shard"),
    (["http://127.0.0.1:9", "--generation", "0"], "--generation"),
])
async def test_bad_options_are_one_line_and_exit_2(args: list[str], words: str) -> None:
    code, _, err = await conformance(*args)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (code, err)
