"""What one client can hold of the GenRM server: hostile request texts, slow and stalled clients,
oversized and malformed bodies, the cap on requests in flight, an open bind without a key, and a
load test of slow clients beside normal ones. Servers are real subprocesses on loopback with small
limits, so that each check takes about a second."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from reasonrl_fast.tasks.addition import addition_steps, make_prompt
from reasonrl_fast.genrm.client import GenRMClient
from reasonrl_fast.genrm.launch import GenRMStartError, launch
from reasonrl_fast.protocol import render

pytestmark = pytest.mark.proc  # real server processes on loopback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAT = "/v1/chat/completions"


def compact(a: int, b: int) -> str:
    steps, ans = addition_steps(a, b, len(str(a)))
    return render("compact", make_prompt(a, b), str(ans), steps.split(","))


def body(content: str, **kw) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], **kw}).encode()


def post(port: int, data: bytes, timeout: float = 10) -> tuple[int, dict, dict]:
    """(status, headers, JSON body); a reply that is not JSON fails the test here."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{CHAT}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, dict(e.headers), json.loads(raw)
        except ValueError:
            pytest.fail(f"HTTP {e.code} with a body that is not JSON: {raw[:200]!r}")


def health(port: int, timeout: float = 5) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
        return json.loads(r.read())


def is_openai_error(reply: dict) -> bool:
    err = reply.get("error")
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"} and bool(err["message"])


def open_request(port: int, content_length: int, sent: bytes = b"") -> socket.socket:
    """A socket that sent a chat request's headers (declaring `content_length`) and `sent` of its
    body, and then nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {content_length}\r\n\r\n".encode() + sent)
    return s


def read_reply(s: socket.socket, timeout: float) -> tuple[int | None, dict | None, float]:
    """(status, JSON body, seconds waited) of the reply on `s`; (None, None, t) when the server
    closes the connection without one."""
    t0 = time.monotonic()
    s.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        data += chunk
        head, sep, rest = data.partition(b"\r\n\r\n")
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if sep and m and len(rest) >= int(m.group(1)):
            break
    waited = time.monotonic() - t0
    if not data:
        return None, None, waited
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(rest), waited


@pytest.fixture(scope="module")
def small():
    """A rule server with limits small enough to hit in a test."""
    with launch("rule:addition", extra_args=["--max-in-flight", "4", "--body-timeout-s", "0.5",
                                             "--idle-timeout-s", "0.5"]) as server:
        yield server


# ---------------------------------------------------------------- request texts


def test_hostile_request_texts_are_answered_at_once_and_the_loop_stays_free(small):
    """Texts on which the old parsers backtracked (40,000 digits took 10 s, with /health
    waiting behind it): a megabyte of each is answered within a second or two, and /health
    answers while they are judged."""
    texts = ["4" * 1_000_000 + "=|x|", "[Problem]\n" * 100_000,
             "1+" + "9" * 5000 + "=|x|",  # an operand over the digit cap, and over Python's 4300
             render("fapo", "1+2=", "3", []).replace("[Solution]\n", "[Solution]\n" + "<step_0>\n" * 100_000)]

    async def run():
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        posts = [loop.run_in_executor(None, post, small.port, body(t), 15) for t in texts]
        await asyncio.sleep(0.05)
        t = time.monotonic()
        await loop.run_in_executor(None, health, small.port, 5)
        health_s = time.monotonic() - t
        return await asyncio.gather(*posts), time.monotonic() - t0, health_s

    (replies, wall, health_s) = asyncio.run(run())
    for text, (status, _, r) in zip(texts[:3], replies):
        assert status == 400 and is_openai_error(r) and r["error"]["param"] == "messages", (text[:20], r)
    status, _, r = replies[3]  # unclosed steps are no steps: judged wrong at step 0
    assert status == 200 and r["choices"][0]["message"]["content"].endswith("\\boxed{0}"), r
    assert "5000 digits" in replies[2][2]["error"]["message"]
    print(f"\n4 hostile requests of ~1 MB: {wall:.2f} s; /health meanwhile {health_s:.3f} s")
    assert wall < 5 and health_s < 1.5, (wall, health_s)


def _slow_judge(monkeypatch, seconds: float):
    """The addition rule backend whose every judge takes `seconds` (in a thread of the server)."""
    from reasonrl_fast.genrm import serve

    backend = serve.RuleBackend()
    real = backend.judge

    def slow(text):
        time.sleep(seconds)
        return real(text)

    monkeypatch.setattr(backend, "judge", slow)
    return backend


def test_judge_runs_off_the_event_loop_with_a_time_cap(monkeypatch):
    """In process (a judge made slow on purpose): /health answers while a judge runs, and a
    judge over completion_timeout_s answers 504 in the API's error format."""
    from aiohttp.test_utils import TestClient, TestServer

    from reasonrl_fast.genrm import serve

    backend = _slow_judge(monkeypatch, 1.5)
    app = serve.make_app(backend, "rule:addition", None, "rule:addition",
                         serve.Limits(completion_timeout_s=0.5))

    async def run():
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            t0 = time.monotonic()
            judged = asyncio.ensure_future(c.post(CHAT, data=body(compact(12, 34))))
            await asyncio.sleep(0.1)
            h = await c.get("/health")
            health_s = time.monotonic() - t0
            r = await judged
            return h.status, health_s, r.status, await r.json(), time.monotonic() - t0

    try:
        h_status, health_s, status, reply, wall = asyncio.run(run())
    finally:
        backend.close()
    assert h_status == 200 and health_s < 1.0, health_s
    assert status == 504 and is_openai_error(reply) and "longer than 0.5 s" in reply["error"]["message"]
    assert wall < 1.4, wall


# ---------------------------------------------------------------- bodies


@pytest.mark.parametrize("raw,words", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"messages": [{"role": "user", "content": "1+2=3|"}], "seed": ' + b"7" * 5000 + b"}", "digits"),
    (b'{"messages": "\xff\xfe"}', "utf-8"),
], ids=["too deep", "a 5000-digit integer", "not utf-8"])
def test_malformed_json_is_400_in_the_api_format(small, raw, words):
    status, _, r = post(small.port, raw)
    assert status == 400 and is_openai_error(r) and r["error"]["param"] == "body", r
    assert words in r["error"]["message"], r


def test_declared_length_over_the_cap_is_413_before_the_body(small):
    s = open_request(small.port, 10**12)
    try:
        status, r, waited = read_reply(s, 5)
    finally:
        s.close()
    assert status == 413 and is_openai_error(r) and "larger than" in r["error"]["message"], r
    assert waited < 1.0, waited


def expect_continue(port: int, content_length: int, key: str | None = None) -> tuple[socket.socket, bytes]:
    """A socket that sent a chat request's headers with `Expect: 100-continue`, and the first line
    the server answered."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
              f"Expect: 100-continue\r\nContent-Length: {content_length}\r\n\r\n".encode())
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return s, data.split(b"\r\n", 1)[0]


def test_expect_100_continue_is_answered_413_when_the_body_is_too_large(small):
    """A declared 1 GB body with `Expect: 100-continue` gets 413 as its first answer, not a
    `100 Continue` inviting the gigabyte (aiohttp's own handler sent that before any check); a body
    within the cap still gets `100 Continue` and then its completion."""
    s, first = expect_continue(small.port, 10**9)
    s.close()
    assert first.startswith(b"HTTP/1.1 413"), first
    data = body(compact(12, 34))
    s, first = expect_continue(small.port, len(data))
    try:
        assert first == b"HTTP/1.1 100 Continue", first
        s.sendall(data)
        status, r, _ = read_reply(s, 5)
    finally:
        s.close()
    assert status == 200 and r["choices"][0]["message"]["content"].endswith("\\boxed{-1}"), r


def test_expect_100_continue_with_a_wrong_key_is_401_first():
    with launch("rule:addition", api_key="k") as server:
        s, first = expect_continue(server.port, 1000, key="wrong")
        s.close()
        assert first.startswith(b"HTTP/1.1 401"), first
        s, first = expect_continue(server.port, 1000, key="k")
        s.close()
        assert first == b"HTTP/1.1 100 Continue", first


def test_slow_body_is_408_and_a_silent_connection_is_closed(small):
    t0 = time.monotonic()
    slow = open_request(small.port, 1000, b'{"messages": ')  # 0.5 s to send the rest
    silent = socket.create_connection(("127.0.0.1", small.port), timeout=10)
    partial = socket.create_connection(("127.0.0.1", small.port), timeout=10)
    partial.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n".encode())  # headers never finished
    gone = open_request(small.port, 1000, b"{")
    time.sleep(0.1)
    gone.close()  # mid-body: an answer nobody reads, not a traceback in the log
    try:
        status, r, _ = read_reply(slow, 5)
        assert status == 408 and is_openai_error(r) and "0.5 s" in r["error"]["message"], r
        assert read_reply(silent, 5)[:2] == (None, None)  # closed by the idle timeout
        assert read_reply(partial, 5)[:2] == (None, None)
    finally:
        for s in (slow, silent, partial):
            s.close()
    assert time.monotonic() - t0 < 3.0
    assert health(small.port)["status"] == "ok"
    with open(small.log_path) as f:
        assert "Traceback" not in f.read()


def test_requests_over_the_reading_cap_wait_then_get_503_with_retry_after():
    """2 reading places, 1 place in the queue: with both held by bodies that do not come, one request
    waits (its body unread) and is served when a place frees; past the queue's length a request is
    503 at once, past its time limit 503 too, both with Retry-After."""
    with launch("rule:addition", extra_args=["--max-reading", "2", "--max-queued", "1", "--queue-timeout-s", "1",
                                             "--body-timeout-s", "30"]) as server:
        port = server.port
        held = [open_request(port, 1000, b"{") for _ in range(2)]
        try:
            deadline = time.monotonic() + 5
            while health(port)["reading"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)

            async def run():
                loop = asyncio.get_running_loop()
                waiting = loop.run_in_executor(None, post, port, body(compact(12, 34)))
                while health(port)["queued"] < 1:
                    await asyncio.sleep(0.01)
                t = time.monotonic()
                refused = await loop.run_in_executor(None, post, port, body(compact(12, 34)))
                at_once = time.monotonic() - t
                await asyncio.sleep(0.2)
                held.pop().close()  # a place frees: the waiting request is served
                return await waiting, refused, at_once

            (w_status, _, w), (r_status, r_headers, r), at_once = asyncio.run(run())
            assert w_status == 200 and w["choices"][0]["message"]["content"].endswith("\\boxed{-1}"), w
            assert r_status == 503 and is_openai_error(r) and r["error"]["code"] == "server_busy", r
            assert r_headers.get("Retry-After") == "1" and "waiting" in r["error"]["message"] and at_once < 0.5

            deadline = time.monotonic() + 5  # the last holder and a new one take both places again
            held.append(open_request(port, 1000, b"{"))
            while health(port)["reading"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            t = time.monotonic()
            status, headers, r = post(port, body(compact(12, 34)))
            assert status == 503 and "within 1 s" in r["error"]["message"] and headers.get("Retry-After") == "1"
            assert 0.9 < time.monotonic() - t < 2.0
            assert health(port)["busy_refused"] == 2
        finally:
            for s in held:
                s.close()


def test_slow_bodies_do_not_hold_the_in_flight_slots():
    """64 connections that sent their headers and half a body, against a server with 4 in-flight
    slots: a valid completion is answered at once. (When a slot was taken before the body was read,
    the 64 held every slot until the body timeout, and the completion got 503 after its wait.)"""
    with launch("rule:addition", extra_args=["--max-in-flight", "4", "--queue-timeout-s", "2",
                                             "--body-timeout-s", "10"]) as server:
        port = server.port
        half = body(compact(12, 34))
        held = [open_request(port, len(half), half[:len(half) // 2]) for _ in range(64)]
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                h = health(port)
                if h["in_flight"] + h["queued"] + h.get("reading", 0) >= 64:
                    break
                time.sleep(0.01)
            t = time.monotonic()
            status, _, r = post(port, body(compact(12, 34)))
            waited = time.monotonic() - t
            h = health(port)
        finally:
            for s in held:
                s.close()
    assert status == 200 and r["choices"][0]["message"]["content"].endswith("\\boxed{-1}"), r
    assert waited < 1.0, waited
    assert h["reading"] == 64 and h["in_flight"] == 0, h


def test_a_read_body_waits_for_a_slot_then_gets_503(monkeypatch):
    """In process, with one slot held by a slow judge: the next request's body is read and parsed
    while it waits for the slot (it holds a reading place, not a slot), and past the queue time
    limit it gets 503 with Retry-After."""
    from aiohttp.test_utils import TestClient, TestServer

    from reasonrl_fast.genrm import serve

    backend = _slow_judge(monkeypatch, 1.0)
    app = serve.make_app(backend, "rule:addition", None, "rule:addition",
                         serve.Limits(max_in_flight=1, queue_timeout_s=0.3))

    async def run():
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            first = asyncio.ensure_future(c.post(CHAT, data=body(compact(12, 34))))
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            second = asyncio.ensure_future(c.post(CHAT, data=body(compact(12, 34))))
            await asyncio.sleep(0.15)
            h = await (await c.get("/health")).json()
            r2 = await second
            waited = time.monotonic() - t0
            r1 = await first
            return h, r2.status, dict(r2.headers), await r2.json(), waited, r1.status

    try:
        h, status, headers, reply, waited, first_status = asyncio.run(run())
    finally:
        backend.close()
    assert (h["in_flight"], h["reading"], h["queued"]) == (1, 1, 0), h
    assert status == 503 and is_openai_error(reply) and "no free slot within 0.3 s" in reply["error"]["message"]
    assert headers.get("Retry-After") == "1" and 0.25 < waited < 0.9, waited
    assert first_status == 200


def test_memory_is_bounded_by_the_reading_and_in_flight_caps():
    """40 concurrent 4 MB requests (each answer echoes its 4 MB step) through a server that reads
    4 at a time and judges 4 at a time: its peak memory stays near 8 requests' worth, where without
    the caps all 40 were read and judged at once and each idle connection kept its last request
    and answer (200 such requests: 87 MB -> 1.0 GB)."""
    big = body("12+34=46|" + "x" * 3_900_000 + "|")
    with launch("rule:addition", extra_args=["--max-in-flight", "4", "--max-reading", "4",
                                             "--queue-timeout-s", "60"]) as server:
        def peak_mb() -> float:
            with open(f"/proc/{server.pid}/status") as f:
                return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024

        before = peak_mb()

        async def run():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=60)) as s:
                async def one():
                    async with s.post(server.url + "/chat/completions", data=big) as r:
                        await r.read()
                        return r.status
                return await asyncio.gather(*(one() for _ in range(40)))

        statuses = asyncio.run(run())
        grown = peak_mb() - before
    print(f"\n40 concurrent 4 MB requests, 4 read and 4 in flight: server peak grew {grown:.0f} MB")
    assert statuses == [200] * 40
    assert grown < 160, grown


# ---------------------------------------------------------------- an open bind


def test_open_bind_needs_a_key_or_an_explicit_flag(tmp_path):
    with pytest.raises(GenRMStartError, match="exited with status 2") as e:
        launch("rule:addition", host="0.0.0.0", start_timeout_s=30)
    assert "--allow-open-without-key" in str(e.value) and "API key" in str(e.value)
    log = tmp_path / "open.log"
    with launch("rule:addition", host="0.0.0.0", extra_args=["--allow-open-without-key"], log_path=str(log)):
        pass
    assert "without an API key" in log.read_text()
    log = tmp_path / "key.log"
    with launch("rule:addition", host="0.0.0.0", api_key="k", log_path=str(log)):
        pass
    assert "without an API key" not in log.read_text()


# ---------------------------------------------------------------- load


def start_with_fd_limit(soft: int, hard: int, args: list[str], log) -> tuple[subprocess.Popen, int]:
    """A rule server started under these limits on open files, once it listens."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.Popen([sys.executable, "-m", "reasonrl_fast.genrm.serve", "--backend", "rule:addition",
                             "--port", "0", *args], stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT), preexec_fn=limit)
    line = proc.stdout.readline().decode()
    proc.stdout.close()  # the server sends its later output to the log
    m = re.search(r":(\d+)/v1", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, int(m.group(1))


def test_server_raises_its_soft_open_file_limit():
    """Many systems start processes at 1024 open files: a thousand idle sockets. The server takes
    what the hard limit allows."""
    with tempfile.TemporaryFile() as log:
        proc, port = start_with_fd_limit(256, 4096, [], log)
        try:
            with open(f"/proc/{proc.pid}/limits") as f:
                line = next(x for x in f if x.startswith("Max open files"))
        finally:
            proc.kill()
            proc.wait()
    assert line.split()[3:5] == ["4096", "4096"], line


async def slow_clients(port: int, n: int, stop: asyncio.Event) -> int:
    """n connections that send their headers and a little of a large body, then half of them
    drip a byte every 0.1 s and half stall; returns how many the server closed."""
    async def one(i: int) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        try:
            writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{{".encode())
            await writer.drain()
            read = asyncio.ensure_future(reader.read())
            try:
                while not stop.is_set() and not read.done():
                    if i % 2:
                        writer.write(b" ")
                        await writer.drain()
                    await asyncio.wait([read], timeout=0.1)
            finally:
                read.cancel()
                await asyncio.gather(read, return_exceptions=True)
            return not stop.is_set()
        except OSError:  # reset by the server while dripping
            return True
        finally:
            writer.close()

    return sum(await asyncio.gather(*(one(i) for i in range(n))))


def test_slow_clients_do_not_lock_out_normal_ones():
    """160 connections that never finish their bodies, against a server that may hold 128 file
    descriptors and serve 4 requests at once (a wait for a slot ends after 0.5 s), beside 20
    verdicts asked through GenRMClient (which retries a 503): the slow ones get 503 or 408 and are
    closed, and every normal request is served within a bound.
    (Without the timeouts, the slow connections held every descriptor and no new client was served.)"""
    log = tempfile.TemporaryFile()
    proc, port = start_with_fd_limit(128, 128, ["--max-in-flight", "4", "--queue-timeout-s", "0.5",
                                                "--body-timeout-s", "0.5", "--idle-timeout-s", "1"], log)
    client = GenRMClient([f"127.0.0.1:{port}"], model="rule:addition", template="compact", timeout_s=5,
                         max_retries=10, backoff_base_s=0.1, backoff_max_s=0.4, fail_threshold=100,
                         max_concurrency=8)
    reqs = []
    for a, b in [(10 + 4 * i, 90 - 3 * i) for i in range(20)]:
        steps, ans = addition_steps(a, b, 2)
        reqs.append((make_prompt(a, b), str(ans), steps.split(",")))

    async def run():
        stop = asyncio.Event()
        attack = asyncio.ensure_future(slow_clients(port, 160, stop))
        await asyncio.sleep(0.3)  # the slow ones are connected first
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        verdicts = await loop.run_in_executor(None, client.judge, reqs)
        wall = time.monotonic() - t0
        await asyncio.sleep(1.5)  # the slow ones still open get their answers
        stop.set()
        return verdicts, wall, await attack

    try:
        verdicts, wall, closed = asyncio.run(run())
        alive = proc.poll() is None
    finally:
        client.close()
        proc.kill()
        proc.wait()
        log.seek(0)
        server_log = log.read().decode(errors="replace")
        log.close()
    print(f"\n160 slow clients + 20 verdicts: the verdicts took {wall:.2f} s; the server closed {closed} "
          f"slow connections")
    assert alive, server_log[-2000:]
    assert [v.step for v in verdicts] == [-1] * 20, [v.error for v in verdicts]
    assert wall < 8.0, wall
    assert closed >= 150, closed
