"""GenRMClient against real server subprocesses on loopback (tests/helpers/fault_server.py): right
verdicts, a server killed and restarted mid-batch, timeouts, malformed replies, a dead replica,
least-outstanding routing, API keys, and close() with requests in flight."""

from __future__ import annotations

import json
import logging
import random
import selectors
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from reasonrl_fast.tasks.addition import addition_steps, first_wrong_step, make_prompt, response_steps
from reasonrl_fast.genrm.client import GenRMClient, Verdict
from reasonrl_fast.protocol import API_KEY_ENV, normalize_address

pytestmark = pytest.mark.proc  # real server processes on loopback

SERVER = Path(__file__).parents[1] / "helpers" / "fault_server.py"


@dataclass
class Server:
    proc: subprocess.Popen
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://{self.address}/stats", timeout=5) as r:
            return json.loads(r.read())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()


def _start(mode: str, port: int, extra: tuple[str, ...]) -> Server:
    """A fault server, once it prints `listening PORT` (a restart on a just-freed port may need a
    few tries)."""
    deadline = time.monotonic() + 15
    while True:
        proc = subprocess.Popen([sys.executable, str(SERVER), "--mode", mode, "--port", str(port), *extra],
                                stdout=subprocess.PIPE, text=True)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(max(0.1, deadline - time.monotonic())) else ""
        sel.close()
        if line.startswith("listening "):
            return Server(proc, int(line.split()[1]))
        Server(proc, port).kill()
        if time.monotonic() > deadline:
            raise RuntimeError(f"fault server --mode {mode} --port {port} did not start")
        time.sleep(0.2)


@pytest.fixture
def servers():
    """start(mode, port=0, *args) -> Server; every server started is killed in teardown."""
    started: list[Server] = []

    def start(mode: str, port: int = 0, *extra: str) -> Server:
        started.append(_start(mode, port, extra))
        return started[-1]

    yield start
    for s in started:
        s.kill()


@pytest.fixture
def client():
    """client(addresses, **kwargs) -> GenRMClient; every client made is closed in teardown."""
    made: list[GenRMClient] = []

    def make(addresses: list[str], **kw) -> GenRMClient:
        kw.setdefault("template", "compact")
        made.append(GenRMClient(addresses, **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def batch(n: int, digits: int = 3) -> tuple[list[tuple[str, str, list[str]]], list[int]]:
    """n addition responses with the right answer, about half with one miswritten column, and the
    index of each one's earliest wrong step."""
    rng = random.Random(torch.initial_seed())
    reqs, truth = [], []
    for _ in range(n):
        lo, hi = 10 ** (digits - 1), 10**digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        miswrite = rng.randrange(digits) if rng.random() < 0.5 else None
        work, answer = addition_steps(a, b, digits, miswrite_at=miswrite)
        steps = response_steps(f"{work} \\boxed{{{answer}}}")
        reqs.append((make_prompt(a, b), str(answer), steps))
        truth.append(first_wrong_step(a, b, steps))
    return reqs, truth


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAST = dict(backoff_base_s=0.01, backoff_max_s=0.02)  # retries in tests need not wait


def test_arguments_and_addresses():
    assert normalize_address("127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalize_address("http://h:1/") == "http://h:1/v1"
    assert normalize_address("https://h.example:443/v1/") == "https://h.example:443/v1"
    assert normalize_address("http://h:1/proxy/v1") == "http://h:1/proxy/v1"
    for bad in ["", "localhost", "ftp://h:1", "http://h:1/v2", "http://h:99999", "h:1?x"]:
        with pytest.raises(ValueError, match="GenRM address"):
            normalize_address(bad)
    for kw, name in [({"timeout_s": 0}, "timeout_s"), ({"max_retries": -1}, "max_retries"),
                     ({"template": "nope"}, "template")]:
        with pytest.raises(ValueError, match=name):
            GenRMClient(["127.0.0.1:1"], **kw)
    with pytest.raises(ValueError, match="addresses"):
        GenRMClient([])
    # The trainer's driver imports the client: it must not pull in torch or the trainer.
    code = ("import sys, reasonrl_fast.genrm.client; "
            "assert not {'torch', 'reasonrl_fast.trainer'} & set(sys.modules), 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    v = Verdict(2, error="", attempts=1, latency_s=0.1)
    assert v.flawed and not Verdict(-1).flawed and not Verdict(None, error="timeout").flawed


def test_verdicts_match_the_step_checker(servers, client):
    s = servers("ok")
    reqs, truth = batch(200)
    assert -1 in truth and any(t >= 0 for t in truth)  # both kinds, so a constant answer fails
    c = client([s.address])  # model "": discovered from /v1/models
    verdicts = c.judge(reqs)
    assert [v.step for v in verdicts] == truth
    assert [v.flawed for v in verdicts] == [t >= 0 for t in truth]
    assert all(v.error == "" and v.attempts == 1 for v in verdicts)
    m = c.metrics()
    assert (m["genrm/requests"], m["genrm/failures"], m["genrm/retries"]) == (200, 0, 0)
    assert 0 < m["genrm/latency_p50_s"] <= m["genrm/latency_p99_s"]
    assert c.metrics()["genrm/requests"] == 0 and c.metrics()["genrm/latency_p99_s"] == 0.0  # reset
    stats = s.stats()
    assert stats["models"] == 1 and stats["chat"] == 200  # the model list is fetched once
    # The full FAPO template carries the same fields.
    assert [v.step for v in client([s.address], template="fapo", model="m").judge(reqs[:20])] == truth[:20]


def test_server_killed_mid_batch_and_restarted(servers, client):
    s = servers("delay", 0, "--delay", "0.02")
    reqs, truth = batch(150)
    c = client([s.address], model="m", timeout_s=2, max_retries=1, max_concurrency=4,
               fail_threshold=2, cooldown_s=0.2, **FAST)
    futures = [c.submit(*r) for r in reqs]
    deadline = time.monotonic() + 10
    while sum(f.done() for f in futures) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.kill()
    verdicts = [f.result(timeout=30) for f in futures]
    answered = [i for i, v in enumerate(verdicts) if v.step is not None]
    lost = [v for v in verdicts if v.step is None]
    assert len(answered) >= 10 and len(lost) >= 50, (len(answered), len(lost))
    assert all(verdicts[i].step == truth[i] for i in answered)
    assert all(v.attempts == 2 and v.error.startswith("connection") for v in lost), {v.error for v in lost}
    m = c.metrics()
    assert m["genrm/failures"] == len(lost) and m["genrm/retries"] >= len(lost)

    servers("ok", s.port)  # the same address comes back
    verdicts = c.judge(reqs[:30])
    assert [v.step for v in verdicts] == truth[:30]
    assert c.metrics()["genrm/failures"] == 0


def test_slower_than_the_timeout(servers, client):
    s = servers("slow")  # sleeps 60 s per request
    n, timeout, retries, base, cap = 6, 0.5, 2, 0.1, 0.15
    c = client([s.address], model="m", timeout_s=timeout, max_retries=retries,
               backoff_base_s=base, backoff_max_s=cap)
    t0 = time.monotonic()
    verdicts = c.judge(batch(n)[0])
    wall = time.monotonic() - t0
    # Every attempt runs to its time limit; the backoff before retry k is at most min(cap, base*2^(k-1)).
    bound = (retries + 1) * timeout + sum(min(cap, base * 2 ** (k - 1)) for k in range(1, retries + 1))
    print(f"\nslow server: judge took {wall:.2f} s, bound {bound:.2f} s + 1 s of slack")
    assert (retries + 1) * timeout <= wall < bound + 1.0, (wall, bound)
    assert all(v.step is None and v.error == "timeout" and v.attempts == retries + 1 for v in verdicts)
    m = c.metrics()
    assert (m["genrm/failures"], m["genrm/retries"], m["genrm/unparseable"]) == (n, n * retries, 0)
    assert s.stats()["chat"] == n * (retries + 1)


@pytest.mark.parametrize("mode,error,retryable", [
    ("http500", "http 500", True), ("nonjson", "non-json reply", True),
    ("nochoices", "no choices[0].message.content", True),
    ("nobox", "unparseable", False), ("out_of_range", "unparseable", False)])
def test_malformed_replies(servers, client, mode, error, retryable):
    s = servers(mode)
    n, retries = 5, 2
    c = client([s.address], model="m", max_retries=retries, **FAST)
    verdicts = c.judge(batch(n)[0])
    attempts = retries + 1 if retryable else 1
    assert all(v.step is None and not v.flawed and v.error == error and v.attempts == attempts
               for v in verdicts), verdicts
    m = c.metrics()
    assert m["genrm/failures"] == n
    assert m["genrm/unparseable"] == (0 if retryable else n)
    assert m["genrm/retries"] == n * (attempts - 1)
    assert s.stats()["chat"] == n * attempts


def test_flaky_server_is_retried(servers, client):
    s = servers("flaky")  # odd-numbered requests get HTTP 500
    reqs, truth = batch(10)
    c = client([s.address], model="m", max_retries=1, **FAST)
    verdicts = [c.judge([r])[0] for r in reqs]  # one at a time: each first attempt is an odd one
    assert [v.step for v in verdicts] == truth and all(v.attempts == 2 for v in verdicts), verdicts
    m = c.metrics()
    assert (m["genrm/failures"], m["genrm/retries"]) == (0, 10)
    assert s.stats()["errors"] == 10


def test_dead_replica_cools_down(servers, client):
    live = [servers("ok"), servers("ok")]
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    n, conc, threshold = 120, 8, 2
    reqs, truth = batch(n)
    c = client([live[0].address, dead, live[1].address], model="m", max_retries=2, max_concurrency=conc,
               fail_threshold=threshold, cooldown_s=30, **FAST)
    verdicts = c.judge(reqs)
    assert [v.step for v in verdicts] == truth  # every request answered by the other two
    m = c.metrics()
    counts = [s.stats()["chat"] for s in live]
    dead_attempts = n + m["genrm/retries"] - sum(counts)
    print(f"\ndead replica: {dead_attempts} attempts, live replicas {counts}, retries {m['genrm/retries']}")
    # Round robin would send it n/3 = 40; it takes only the attempts in flight before it trips.
    assert threshold <= dead_attempts <= conc + threshold, (dead_attempts, counts)
    assert min(counts) >= n // 10  # least outstanding follows each server's speed on a busy machine
    status = c.replica_status()
    assert status[1]["cooldown_left_s"] > 20
    assert status[0]["cooldown_left_s"] == status[2]["cooldown_left_s"] == 0


def test_replica_back_after_cool_down(servers, client):
    """A replica that failed is skipped for cooldown_s, then tried again and used once it answers."""
    live, port = servers("ok"), free_port()
    reqs, truth = batch(40)
    c = client([live.address, f"127.0.0.1:{port}"], model="m", fail_threshold=1, cooldown_s=0.5,
               max_concurrency=4, **FAST)
    assert [v.step for v in c.judge(reqs)] == truth
    assert c.replica_status()[1]["cooldown_left_s"] > 0
    back = servers("ok", port)
    time.sleep(0.6)
    assert [v.step for v in c.judge(reqs)] == truth
    assert back.stats()["chat"] >= 5 and c.replica_status()[1]["fails"] == 0


def test_submit_from_several_threads(servers, client):
    s = servers("ok")
    reqs, truth = batch(200)
    c = client([s.address], model="m")
    with ThreadPoolExecutor(4) as pool:  # the driver may submit from callbacks on other threads
        futures = list(pool.map(lambda r: c.submit(*r), reqs))
    assert [f.result(timeout=30).step for f in futures] == truth
    assert c.metrics()["genrm/requests"] == 200


def test_least_outstanding_routing(servers, client):
    fast, slow = servers("ok"), servers("delay", 0, "--delay", "0.2")
    n = 100
    reqs, truth = batch(n)
    c = client([slow.address, fast.address], model="m", max_concurrency=8)
    assert [v.step for v in c.judge(reqs)] == truth
    f, s = fast.stats()["chat"], slow.stats()["chat"]
    print(f"\nleast outstanding: fast replica {f} requests, slow (200 ms) replica {s}")
    assert f + s == n and f >= 4 * s, (f, s)  # round robin would split 50/50


def test_api_key(servers, client, monkeypatch, caplog):
    s = servers("key", 0, "--key", "secret")
    reqs, truth = batch(4)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="reasonrl_fast.genrm.client"):
        verdicts = client([s.address], model="m", api_key="wrong", **FAST).judge(reqs)
    assert all(v.step is None and v.error == "refused: 401" and v.attempts == 1 for v in verdicts)
    warnings = [r.getMessage() for r in caplog.records if "refused the API key" in r.getMessage()]
    assert len(warnings) == 1 and s.address in warnings[0], warnings  # one clear warning, not one per request
    # No key at all: the model list is refused the same way, and nothing is retried.
    c = client([s.address], **FAST)
    verdicts = c.judge(reqs)
    assert all(v.step is None and v.error == "model list: refused: 401" for v in verdicts), verdicts
    assert c.metrics()["genrm/retries"] == 0
    assert s.stats()["generated"] == 0
    # The right key, from the environment.
    monkeypatch.setenv(API_KEY_ENV, "secret")
    assert [v.step for v in client([s.address], **FAST).judge(reqs)] == truth
    assert s.stats()["generated"] == 4


def test_close_with_requests_in_flight(servers, client):
    s = servers("slow")
    c = client([s.address], model="m", timeout_s=30)
    futures = [c.submit(*r) for r in batch(10)[0]]
    time.sleep(0.3)
    t0 = time.monotonic()
    c.close()
    print(f"\nclose() with 10 requests in flight: {time.monotonic() - t0:.3f} s")
    assert time.monotonic() - t0 < 3.0
    verdicts = [f.result(timeout=1) for f in futures]
    assert all(v.step is None and v.error == "closed" for v in verdicts)
    assert not c._thread.is_alive()
    c.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        c.submit(*batch(1)[0][0])


def test_overhead_per_request(servers, client):
    """Measured: wall and client-process CPU per request, 1000 requests at concurrency 64 (the
    server is another process, so the CPU is the client's alone)."""
    s = servers("ok")
    n = 1000
    reqs, truth = batch(n)
    c = client([s.address], model="m", max_concurrency=64)
    c.judge(reqs[:64])  # connections opened
    cpu0, t0 = time.process_time(), time.perf_counter()
    verdicts = c.judge(reqs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert [v.step for v in verdicts] == truth
    m = c.metrics()
    print(f"\nGenRMClient, {n} requests at concurrency 64: {1e3 * wall / n:.3f} ms wall/request, "
          f"{1e3 * cpu / n:.3f} ms client CPU/request, p50 {m['genrm/latency_p50_s'] * 1e3:.1f} ms, "
          f"p99 {m['genrm/latency_p99_s'] * 1e3:.1f} ms")
    assert cpu / n < 0.005  # a few hundred µs expected; 5 ms would mean something is badly wrong
