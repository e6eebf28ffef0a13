"""GenRMClient against replicas that send what no verdict needs: a reply far over the size cap
(valid, with a verdict, or endless), a declared length over it, JSON nested past the recursion
limit; each costs its requests their verdicts (retried, counted, one log line per kind and step),
never the driver's memory. The replica is an aiohttp server on a thread of the test process."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest
from aiohttp import web

from reasonrl_fast.tasks.addition import addition_steps, make_prompt
from reasonrl_fast.genrm.client import MAX_REPLY_BYTES, GenRMClient, failure_kind

pytestmark = pytest.mark.proc  # a real server on loopback

CAP = 1 << 20
STATS = web.AppKey("stats", dict)
FAST = dict(backoff_base_s=0.01, backoff_max_s=0.02, model="m", template="compact")


def reply(content: str, pad: int = 0) -> bytes:
    """A chat completion whose JSON is padded with `pad` spaces (still valid, still a verdict)."""
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode() \
        + b" " * pad


async def chat(request: web.Request) -> web.StreamResponse:
    stats = request.app[STATS]
    mode = stats["mode"]
    stats["calls"] += 1
    await request.read()
    if mode == "huge":  # a right verdict inside 20 MB
        return web.Response(body=reply("\\boxed{-1}", 20 << 20), content_type="application/json")
    if mode == "endless":  # chunked, no length, never ends
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(reply("\\boxed{-1}")[:-1])
        try:
            while True:
                await resp.write(b" " * 65536)
        except (ConnectionError, RuntimeError):
            return resp
    if mode == "declared":  # a length far over the cap, and a body that never comes
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": str(10**9)})
        await resp.prepare(request)
        await asyncio.sleep(30)
        return resp
    if mode == "deep":
        return web.Response(body=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
    if mode == "http503":
        return web.Response(status=503, text="busy")
    return web.Response(body=reply("\\boxed{-1}"), content_type="application/json")


@pytest.fixture
def replica():
    """replica(mode) -> (address, stats); the server runs on its own thread until the test ends."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = []

    def start(mode: str):
        async def up():
            app = web.Application(client_max_size=1 << 20)
            stats = {"mode": mode, "calls": 0}
            app[STATS] = stats
            app.router.add_post("/v1/chat/completions", chat)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            return f"127.0.0.1:{runner.addresses[0][1]}", stats
        return asyncio.run_coroutine_threadsafe(up(), loop).result(10)

    yield start
    for r in runners:
        asyncio.run_coroutine_threadsafe(r.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def requests(n: int) -> list[tuple[str, str, list[str]]]:
    out = []
    for i in range(n):
        a, b = 11 + i, 22 + i
        steps, ans = addition_steps(a, b, 2)
        out.append((make_prompt(a, b), str(ans), steps.split(",")))
    return out


def test_reply_cap_argument():
    assert MAX_REPLY_BYTES == 4 << 20
    with pytest.raises(ValueError, match="max_reply_bytes"):
        GenRMClient(["127.0.0.1:1"], max_reply_bytes=0)


@pytest.mark.parametrize("mode", ["huge", "endless", "declared"])
def test_reply_over_the_cap_is_a_retried_failure(replica, mode):
    """A 20 MB reply that holds a right verdict, an endless one and one that declares 1 GB: none is
    read past the cap or accepted; each attempt fails at once and is retried."""
    address, stats = replica(mode)
    n, retries = 4, 2
    with GenRMClient([address], max_retries=retries, timeout_s=5, max_reply_bytes=CAP, **FAST) as c:
        t0 = time.monotonic()
        verdicts = c.judge(requests(n))
        wall = time.monotonic() - t0
        m = c.metrics()
    assert all(v.step is None and v.error == f"reply over {CAP} bytes" and v.attempts == retries + 1
               for v in verdicts), verdicts
    assert m["genrm/failures"] == n and m["genrm/retries"] == n * retries
    assert stats["calls"] == n * (retries + 1)
    assert wall < 4.0, wall  # no attempt waited for its time limit (or read 20 MB, or read forever)


def test_default_cap_accepts_a_normal_reply(replica):
    address, _ = replica("ok")
    with GenRMClient([address], **FAST) as c:
        assert [v.step for v in c.judge(requests(3))] == [-1] * 3


def test_deeply_nested_reply_is_retried_counted_and_logged_once(replica, caplog):
    """JSON nested past the recursion limit was a RecursionError: a traceback per request and a
    verdict with attempts=0. Now a retried 'non-json reply', one log line per kind and step."""
    deep, _ = replica("deep")
    busy, _ = replica("http503")
    n, retries = 6, 1
    with caplog.at_level(logging.WARNING, logger="reasonrl_fast.genrm.client"):
        with GenRMClient([deep], max_retries=retries, **FAST) as c, \
                GenRMClient([busy], max_retries=retries, **FAST) as c503:
            for step in range(2):
                caplog.clear()
                verdicts = c.judge(requests(n)) + c503.judge(requests(n))
                m, m503 = c.metrics(), c503.metrics()
                assert [v.error for v in verdicts] == ["non-json reply: nested too deeply"] * n + ["http 503"] * n
                assert all(v.step is None and v.attempts == retries + 1 for v in verdicts), verdicts
                assert m["genrm/failures"] == m503["genrm/failures"] == n
                records = [r for r in caplog.records if r.name == "reasonrl_fast.genrm.client"]
                assert len(records) == 2, [r.getMessage() for r in records]  # one per kind, this step
                assert all(r.exc_info is None for r in records)
                assert {("nested too deeply" in r.getMessage(), "http 503" in r.getMessage()) for r in records} \
                    == {(True, False), (False, True)}


def test_failure_kind():
    assert failure_kind("client error: KeyError: 'choices'") == "client error: KeyError"
    assert failure_kind("timeout") == "timeout" and failure_kind("http 503") == "http 503"
    assert failure_kind("model list: refused: 401") == "model list: refused: 401"
