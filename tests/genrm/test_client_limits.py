"""GenRMClient against replicas that send what no verdict needs: a reply far over the size cap
(valid, with a verdict, or endless), a declared length over it, a gzip reply that inflates to
300 MB, JSON nested past the recursion limit or holding 300k values; each costs its requests
their verdicts (retried, counted, one log line per kind and step), never the driver's memory. The replica is an aiohttp
server on a thread of the test process; where the client's memory is measured, the client runs
in a child process."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import logging
import os
import subprocess
import sys
import time
import zlib

import pytest
from aiohttp import web

from reasonrl_fast.tasks.addition import addition_steps, make_prompt
from reasonrl_fast.genrm.client import MAX_REPLY_BYTES, MIN_VALUES, GenRMClient, failure_kind, json_values
from tests.helpers.loopback import app_server

pytestmark = pytest.mark.proc  # a real server on loopback

CAP = 1 << 20
STATS = web.AppKey("stats", dict)
FAST = dict(backoff_base_s=0.01, backoff_max_s=0.02, model="m", template="compact")


# vLLM's own refusal of a max_tokens over its --max-model-len, as vLLM 0.32 words it
VLLM_400 = ("max_tokens=1024 cannot be greater than max_model_len=256. Please request fewer output tokens. "
            "(parameter=max_tokens, value=1024)")
REFUSALS = {
    "refuse_openai": {"error": {"message": VLLM_400, "type": "BadRequestError", "param": "max_tokens", "code": 400}},
    "refuse_string": {"error": "bad\nrequest\t here"},     # vLLM's 401 shape: a string; whitespace folds
    "refuse_detail": {"detail": "Not Found"},               # FastAPI's
    "refuse_long": {"error": {"message": "x" * 5000}},      # an untrusted reason is cut
    "refuse_huge": {"error": {"message": "y" * (1 << 20)}},  # a body over the error read cap
    "refuse_html": b"<html>nginx</html>",
    "refuse_odd": {"error": {"message": 5}},
}


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
    if mode.startswith("big_"):
        return await big_reply(request, stats)
    if mode in ENCODED:  # a normal reply, compressed
        return web.Response(body=ENCODED[mode][1](reply("\\boxed{-1}")), content_type="application/json",
                            headers={"Content-Encoding": ENCODED[mode][0]})
    if mode == "values":  # a verdict beside 300k empty lists: under 1 MB, 20 MB once parsed
        return web.Response(body=reply("\\boxed{-1}")[:-1] + b', "pad": [' + b",".join([b"[]"] * 300_000) + b"]}",
                            content_type="application/json")
    if mode == "braces":  # a verdict whose text holds 500k brackets, colons and commas: one string
        return web.Response(body=reply("{a}, [b]: " * 50_000 + "\\boxed{-1}"), content_type="application/json")
    if mode == "deep":
        return web.Response(body=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
    if mode == "http503":
        return web.Response(status=503, text="busy")
    if mode.startswith("refuse"):  # a 400 whose body is the reason in one shape or another
        body = REFUSALS[mode]
        return web.Response(status=400, body=body if isinstance(body, bytes) else json.dumps(body).encode(),
                            content_type="application/json")
    return web.Response(body=reply("\\boxed{-1}"), content_type="application/json")


ENCODED = {  # mode: (Content-Encoding, how the body is made)
    "gzip": ("gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "raw_deflate": ("deflate", lambda b: zlib.compress(b)[2:-4]),  # without zlib's header, as some servers send
    "gzip_members": ("gzip", lambda b: gzip.compress(b[:9]) + gzip.compress(b[9:])),
    "br": ("br", lambda b: b),
    "broken_gzip": ("gzip", lambda b: gzip.compress(b)[:12] + b"not gzip" * 4),
}


@pytest.mark.parametrize("mode, error", [("gzip", ""), ("deflate", ""), ("raw_deflate", ""), ("gzip_members", ""),
                                         ("br", "reply in an encoding not asked for: br"),
                                         ("broken_gzip", "reply: broken compressed body")])
def test_compressed_replies_are_decoded_by_the_client(replica, mode, error):
    """The client decodes gzip and deflate itself (so that the cap applies to the decoded bytes):
    a compressed verdict reads as one; an encoding it did not ask for, or a broken body, is a
    retried failure."""
    address, stats = replica(mode)
    with GenRMClient([address], max_retries=1, **FAST) as c:
        verdicts = c.judge(requests(2))
    assert [(v.step, v.error) for v in verdicts] == [(None if error else -1, error)] * 2, verdicts
    assert stats["calls"] == (4 if error else 2)


BIG = 300 << 20
PIECE = 1 << 16


@functools.lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """A chat completion with a verdict, padded to BIG bytes and gzipped: 1.3 MB on the wire."""
    z = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(reply("\\boxed{-1}"))]
    pad = b" " * (1 << 20)
    out += [z.compress(pad) for _ in range(BIG >> 20)]
    return b"".join(out) + z.flush()


async def big_reply(request: web.Request, stats: dict) -> web.StreamResponse:
    """BIG bytes written PIECE at a time (the server never holds them): with their length declared
    (big_declared), chunked without one (big_chunked), or gzipped (big_gzip). stats["sent"] counts
    the bytes written; stats["ended"] says how the writing ended."""
    mode = stats["mode"]
    headers = {"Content-Type": "application/json"}
    if mode == "big_declared":
        headers["Content-Length"] = str(BIG)
    if mode == "big_gzip":
        headers["Content-Encoding"] = "gzip"
    resp = web.StreamResponse(headers=headers)
    if mode != "big_declared":
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    body = gzip_bomb() if mode == "big_gzip" else None
    try:
        for i in range(0, len(body) if body else BIG, PIECE):
            piece = body[i:i + PIECE] if body else b" " * PIECE
            await resp.write(piece)
            stats["sent"] += len(piece)
        await resp.write_eof()
        stats["ended"] = "sent"
    except ConnectionError:
        stats["ended"] = "closed"
    return resp


@pytest.fixture
def replica():
    """replica(mode) -> (address, stats); the server runs on its own thread until the test ends."""
    def start(serve, mode: str):
        app = web.Application(client_max_size=1 << 20)
        stats = {"mode": mode, "calls": 0, "sent": 0, "ended": None}
        app[STATS] = stats
        app.router.add_post("/v1/chat/completions", chat)
        return serve(app, shutdown_timeout=0.5), stats

    with app_server() as serve:
        yield lambda mode: start(serve, mode)


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


# The client in a child process, so that its peak resident memory is its own and not the server's.
# Writing 5 to /proc/self/clear_refs resets the peak (VmHWM) to the memory in use now: a peak left
# from the imports would hide what a reply adds under it.
CHILD = r"""
import json, re, sys
from reasonrl_fast.genrm.client import GenRMClient

def kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(field + r":\s+(\d+)", f.read()).group(1))

def ask(address):
    with GenRMClient([address], model="m", template="compact", max_retries=0, timeout_s=20) as c:
        verdict = c.judge([("11+22=", "33", ["3", "3"])])[0]
        out = {"step": verdict.step, "error": verdict.error, "failures": c.metrics()["genrm/failures"]}
        print(json.dumps(out), flush=True)
        sys.stdin.readline()  # the parent looks at the server's side while this client still lives

ask(sys.argv[1])  # a normal reply first: what any request costs is in the baseline
for address in sys.argv[2:]:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = kib("VmRSS")
    ask(address)
    print(json.dumps({"grown": (kib("VmHWM") - base) * 1024}), flush=True)
"""


def test_a_refused_reply_is_not_read_past_the_cap():
    """300 MB replies, declared, chunked without a length, and gzipped (1.3 MB that inflates to
    300 MB): each is refused at the cap, counted as one failure, and the client's peak memory
    grows by under 3x the cap; the connection is closed (the server's writing ends with a closed
    connection while the client still lives), after far less than the reply was sent."""
    modes = ["big_declared", "big_chunked", "big_gzip"]
    gzip_bomb()  # built before the clock matters
    with app_server() as serve:
        servers = []
        for mode in ["ok", *modes]:
            app = web.Application()
            stats = {"mode": mode, "calls": 0, "sent": 0, "ended": None}
            app[STATS] = stats
            app.router.add_post("/v1/chat/completions", chat)
            servers.append((serve(app, shutdown_timeout=0.5), stats))
        child = subprocess.Popen([sys.executable, "-c", CHILD, *(a for a, _ in servers)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        try:
            results = {}
            for (_, stats) in servers:
                mode = stats["mode"]
                line = child.stdout.readline()
                assert line, f"the client process ended early ({mode})"
                results[mode] = json.loads(line)
                if mode in ("big_declared", "big_chunked"):
                    deadline = time.monotonic() + 5
                    while stats["ended"] is None and time.monotonic() < deadline:
                        time.sleep(0.01)
                    results[mode].update(ended=stats["ended"], sent=stats["sent"])
                child.stdin.write("\n")
                child.stdin.flush()
                if mode != "ok":
                    results[mode].update(json.loads(child.stdout.readline()))
            assert child.wait(10) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    print("\n" + "\n".join(f"{m}: {r}" for m, r in results.items()))
    assert results["ok"] == {"step": -1, "error": "", "failures": 0}
    for mode in modes:
        r = results[mode]
        assert (r["step"], r["error"], r["failures"]) == (None, f"reply over {MAX_REPLY_BYTES} bytes", 1), r
        assert r["grown"] < 3 * MAX_REPLY_BYTES, (mode, r)
    for mode in ("big_declared", "big_chunked"):
        assert results[mode]["ended"] == "closed" and results[mode]["sent"] < BIG // 10, results[mode]


def test_json_values():
    """Never fewer than json.loads makes; what strings hold does not count."""
    for raw in [b'{"a": [1, 2, {"b": "x,y:[{"}], "c": {}}', b'"a\\",b"', b"[]", b"5", b"[[], {}, [[]]]",
                b'{"k": "\\\\", "l": [true, null, -1.5e3]}']:
        data = json.loads(raw)
        made = 0
        stack = [data]
        while stack:
            v = stack.pop()
            made += 1
            stack += list(v.values()) + list(v.keys()) if isinstance(v, dict) else v if isinstance(v, list) else []
        assert made <= json_values(raw) <= made + raw.count(b"[") + raw.count(b"{"), (raw, made, json_values(raw))


@pytest.mark.parametrize("mode, error", [("values", "reply: too many JSON values"), ("braces", "")])
def test_a_reply_of_many_values_is_refused_before_it_is_parsed(replica, mode, error):
    """Within the cap, a reply of 300k values (20 MB parsed, from 900 KB) is a retried failure
    with a 1 MiB cap; a verdict whose text holds as many brackets is read as usual."""
    address, stats = replica(mode)
    assert 1 << 20 > 300_000 * 3 and (1 << 20) // 32 < 300_000 and MIN_VALUES < 300_000
    with GenRMClient([address], max_retries=1, max_reply_bytes=CAP, **FAST) as c:
        verdicts = c.judge(requests(2))
    assert [(v.step, v.error) for v in verdicts] == [(None if error else -1, error)] * 2, verdicts
    assert stats["calls"] == (4 if error else 2)


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
    assert failure_kind("http 404: The model `gpt-4` does not exist.") == "http 404"
    assert failure_kind("model list: http 404: no route") == "model list: http 404"


@pytest.mark.parametrize("mode, error", [
    ("refuse_openai", f"http 400: {VLLM_400}"),
    ("refuse_string", "http 400: bad request here"),
    ("refuse_detail", "http 400: Not Found"),
    ("refuse_long", "http 400: " + "x" * 300 + "..."),
    ("refuse_huge", "http 400"),
    ("refuse_html", "http 400"),
    ("refuse_odd", "http 400"),
])
def test_a_refusal_carries_the_servers_reason(replica, caplog, mode, error):
    """A 4xx was reported as its status alone, so a run whose every verdict vLLM refused for a
    max_tokens over --max-model-len said "http 400" and nothing of why. The reason now comes with
    it, one line and bounded; the request is still not retried, and its kind stays the status."""
    address, stats = replica(mode)
    with caplog.at_level(logging.WARNING, logger="reasonrl_fast.genrm.client"), \
            GenRMClient([address], max_retries=2, **FAST) as c:
        verdicts = c.judge(requests(3))
        m = c.metrics()
    assert [(v.step, v.error, v.attempts) for v in verdicts] == [(None, error, 1)] * 3
    assert failure_kind(error) == "http 400"
    assert m["genrm/failures"] == 3 and m["genrm/retries"] == 0 and stats["calls"] == 3
    logged = [r.getMessage() for r in caplog.records if r.name == "reasonrl_fast.genrm.client"]
    assert len(logged) == 1 and error[:300] in logged[0], logged  # once per kind and step, with the reason
