"""The GenRM server through real HTTP on loopback: server subprocesses started with `launch`
(port 0), the OpenAI schema and its errors, the API key, the rule judge against the step checker,
the hf backend's batching, and `launch`'s own failures and cleanup. The file took 45 s on the
shared 2-core machine (load ~4), 13-16 s of it the hf server's start (torch and transformers)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
import torch

from reasonrl_fast.tasks.addition import addition_steps, flawed_step, make_prompt, parse_problem, response_steps
from reasonrl_fast.genrm.launch import launch
from reasonrl_fast.protocol import parse_verdict, render
from tests.helpers.procs import alive

pytestmark = pytest.mark.proc  # real server processes on loopback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def call(url: str, body: object | bytes | None = None, key: str | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a GET (body None) or POST."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health(server) -> dict:
    return call(f"http://127.0.0.1:{server.port}/health")[1]


def chat(content: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], **kw}


def compact(a: int, b: int) -> str:
    steps, ans = addition_steps(a, b, len(str(a)))
    return render("compact", make_prompt(a, b), str(ans), steps.split(","))


@pytest.fixture(scope="module")
def rule():
    with launch("rule:addition") as server:
        yield server


# ---------------------------------------------------------------- schema and errors


def test_chat_models_health_schema(rule):
    before = health(rule)
    assert before["status"] == "ok" and before["backend"] == "rule:addition"
    status, r = call(rule.url + "/chat/completions",
                     chat(compact(37, 45), model="rule:addition", max_tokens=500, temperature=0, seed=3))
    assert status == 200, r
    assert r["id"].startswith("chatcmpl-") and r["object"] == "chat.completion"
    assert r["model"] == "rule:addition" and abs(r["created"] - time.time()) < 60
    (choice,) = r["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop" and parse_verdict(choice["message"]["content"], 2, "compact") == -1
    u = r["usage"]
    assert u["prompt_tokens"] == len(compact(37, 45))  # characters are this backend's tokens
    assert u["completion_tokens"] == len(choice["message"]["content"])
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert health(rule)["completions"] == before["completions"] + 1

    # content as text parts, and a system message before it, read the same
    parts = {"messages": [{"role": "system", "content": "judge"},
                          {"role": "user", "content": [{"type": "text", "text": compact(37, 45)[:4]},
                                                       {"type": "text", "text": compact(37, 45)[4:]}]}]}
    assert call(rule.url + "/chat/completions", parts)[1]["choices"][0]["message"] == choice["message"]

    status, m = call(rule.url + "/models")
    assert status == 200 and m["object"] == "list"
    assert [(d["id"], d["object"], d["owned_by"]) for d in m["data"]] == [("rule:addition", "model", "reasonrl_fast")]
    assert isinstance(m["data"][0]["created"], int)


def test_max_tokens_and_stop(rule):
    full = call(rule.url + "/chat/completions", chat(compact(58, 67)))[1]["choices"][0]["message"]["content"]
    r = call(rule.url + "/chat/completions", chat(compact(58, 67), max_completion_tokens=7))[1]
    assert r["choices"][0]["message"]["content"] == full[:7] and r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 7
    r = call(rule.url + "/chat/completions", chat(compact(58, 67), stop=["\n"]))[1]
    assert r["choices"][0]["message"]["content"] == full.split("\n")[0]


def test_wrong_model_is_404(rule):
    status, r = call(rule.url + "/chat/completions", chat(compact(12, 34), model="gpt-4"))
    assert status == 404 and "gpt-4" in r["error"]["message"] and r["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("body, param", [
    (b"{not json", "body"),
    (b"[1, 2]", None),
    ({"model": "rule:addition"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    (chat("1+2=3|1+2=3|", max_tokens="5"), "max_tokens"),
    (chat("1+2=3|1+2=3|", max_tokens=0), "max_tokens"),
    (chat("1+2=3|1+2=3|", max_completion_tokens=True), "max_completion_tokens"),
    (chat("1+2=3|1+2=3|", temperature="hot"), "temperature"),
    (chat("1+2=3|1+2=3|", temperature=3), "temperature"),
    (chat("1+2=3|1+2=3|", top_p=0), "top_p"),
    (chat("1+2=3|1+2=3|", n=2), "n"),
    (chat("1+2=3|1+2=3|", seed=1.5), "seed"),
    (chat("1+2=3|1+2=3|", stop=5), "stop"),
    (chat("1+2=3|1+2=3|", stream=True), "stream"),
    (chat("1+2=3|1+2=3|", model=7), "model"),
    (chat("what is the weather?"), "messages"),  # not a GenRM request: the rule judge cannot read it
    ({"messages": [{"role": "system", "content": "1+2=3|1+2=3|"}]}, "messages"),  # no user message
])
def test_bad_bodies_are_400_naming_the_field(rule, body, param):
    before = health(rule)["completions"]
    status, r = call(rule.url + "/chat/completions", body)
    assert status == 400, r
    err = r["error"]
    assert set(err) >= {"message", "type", "code"} and err["param"] == param
    if param not in (None, "body"):
        assert param.split(".")[-1].split("[")[0] in err["message"]
    assert health(rule)["completions"] == before


def test_oversized_body_and_unknown_route(rule):
    status, r = call(rule.url + "/chat/completions", chat("1+2=3|" + "x" * (5 << 20)))
    assert status == 413 and "larger than" in r["error"]["message"]
    status, r = call(rule.url + "/completions", chat("1+2=3|"))
    assert status == 404 and "error" in r


def test_api_key():
    with launch("rule:addition", api_key="s3cret") as server:
        url = server.url + "/chat/completions"
        for key in (None, "wrong", "s3cre", "s3crets"):
            status, r = call(url, chat(compact(19, 23)), key=key)
            assert status == 401 and r["error"]["code"] == "invalid_api_key"
            assert call(server.url + "/models", key=key)[0] == 401
        assert health(server)["completions"] == 0  # nothing was generated for them
        status, r = call(url, chat(compact(19, 23)), key="s3cret")
        assert status == 200 and r["choices"][0]["message"]["content"].endswith("\\boxed{-1}")
        assert call(server.url + "/models", key="s3cret")[0] == 200
        assert health(server)["completions"] == 1


# ---------------------------------------------------------------- the rule judge


def random_response(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, response, kind): clean, miswritten, slipped, a step missing, or a step extra."""
    d = rng.randint(2, 5)
    a, b = rng.randint(10 ** (d - 1), 10**d - 1), rng.randint(10 ** (d - 1), 10**d - 1)
    kind = rng.choice(["clean", "miswrite", "slip", "missing", "extra"])
    slip = rng.randrange(1, d) if kind == "slip" else None
    steps, ans = addition_steps(a, b, d, slip, rng.randrange(d) if kind == "miswrite" else None)
    steps = steps.split(",")
    if kind == "missing":
        del steps[rng.randrange(len(steps))]
    if kind == "extra":
        steps.insert(rng.randint(0, len(steps)), f"{rng.randint(0, 9)}+{rng.randint(0, 9)}={rng.randint(0, 18)}")
    return make_prompt(a, b), f"{','.join(steps)} \\boxed{{{ans}}}", kind


async def _post_all(url: str, bodies: list[dict], concurrency: int = 16) -> list[tuple[int, dict]]:
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        async def one(body):
            async with sem, s.post(url, json=body) as r:
                return r.status, await r.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def test_rule_judge_agrees_with_the_step_checker(rule):
    rng = random.Random(torch.initial_seed())  # the session's seed (tests/conftest.py)
    cases, bodies = [], []
    for _ in range(200):
        prompt, response, kind = random_response(rng)
        steps, truth = response_steps(response), flawed_step(prompt, response)
        for template in ("compact", "fapo"):
            cases.append((steps, truth, kind, template))
            bodies.append(chat(render(template, prompt, str(sum(parse_problem(prompt))), steps), temperature=0))
    answers = asyncio.run(_post_all(rule.url + "/chat/completions", bodies))
    seen = set()
    for (steps, truth, kind, template), (status, r) in zip(cases, answers):
        assert status == 200, r
        text = r["choices"][0]["message"]["content"]
        assert parse_verdict(text, len(steps), template) == truth, (steps, truth, text)
        seen.add((kind, truth == -1))
    # the sample covers right work and flaws of every kind (a slip or a miswrite is always a flaw)
    assert {("clean", True), ("miswrite", False), ("slip", False), ("missing", False), ("extra", False)} <= seen


# ---------------------------------------------------------------- the hf backend

MAX_POS = 64


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    """A random tiny Qwen2 with the character tokenizer, saved as the trainer saves its warm start."""
    import torch

    from reasonrl_fast.config import ModelConfig
    from reasonrl_fast.models.tiny import char_tokenizer, tiny_model

    path = str(tmp_path_factory.mktemp("genrm") / "tiny-genrm")
    tok = char_tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, max_position_embeddings=MAX_POS)
    model = tiny_model(cfg, len(tok), tok)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf(tiny_dir):
    path = tiny_dir
    with launch(f"hf:{path}", max_batch=16, extra_args=["--device", "cpu"], start_timeout_s=120) as server:
        yield server


def test_hf_batches_concurrent_requests_like_single_ones(hf, tiny_dir):
    rng = random.Random(torch.initial_seed())
    prompts = [compact(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(16)]
    bodies = [chat(p, model="tiny-genrm", temperature=0, max_tokens=12) for p in prompts]
    before = health(hf)
    together = asyncio.run(_post_all(hf.url + "/chat/completions", bodies))
    after = health(hf)
    assert all(s == 200 for s, _ in together), together
    calls = after["generate_calls"] - before["generate_calls"]
    assert calls < 16 and after["max_batch_seen"] > 1, after
    for body, (_, r) in zip(bodies, together):
        status, alone = call(hf.url + "/chat/completions", body)
        assert status == 200
        a, b = alone["choices"][0]["message"]["content"], r["choices"][0]["message"]["content"]
        # greedy: the batch changes nothing, except where the model's two best next tokens are
        # within float32 rounding of each other (a batch of 16 runs other matmul kernels)
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert _top2_gap(tiny_dir, body["messages"][0]["content"] + a[:at]) < 1e-4, (a, b)
        u, finish = r["usage"], r["choices"][0]["finish_reason"]
        assert 1 <= u["completion_tokens"] <= 12 and u["prompt_tokens"] == len(body["messages"][0]["content"])
        # "length" only at the cap; "stop" below it or at it, when the 12th token is the EOS
        # (counted, as OpenAI and vLLM count it)
        assert finish in ("stop", "length")
        assert finish == "stop" or u["completion_tokens"] == 12, (finish, u)
    # a random 97-token model rarely samples its EOS within 12 tokens
    assert any(r["choices"][0]["finish_reason"] == "length" for _, r in together)


def _top2_gap(path: str, text: str) -> float:
    """The gap between the tiny model's two largest next-token logits after `text`."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl_fast.models.loading import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    ids = load_tokenizer(path)(text)["input_ids"]
    with torch.inference_mode():
        top = model(torch.tensor([ids])).logits[0, -1].topk(2).values
    return float(top[0] - top[1])


def test_hf_max_tokens_clamped_to_the_context(hf):
    long = "1+2=" + "3" * (MAX_POS - 7)  # MAX_POS - 3 characters: room for 3 new tokens
    status, r = call(hf.url + "/chat/completions", chat(long, max_tokens=50, temperature=0))
    assert status == 200 and r["usage"]["prompt_tokens"] == MAX_POS - 3
    assert r["usage"]["completion_tokens"] <= 3 and r["usage"]["total_tokens"] <= MAX_POS
    # the long prompt and a short one sent together: each keeps its own limit, the short one's
    # answer is the one it gets alone (they go to separate generate calls when they cannot share one)
    short = chat("12+34=", max_tokens=20, temperature=0)
    both = asyncio.run(_post_all(hf.url + "/chat/completions", [chat(long, max_tokens=50, temperature=0), short]))
    assert [s for s, _ in both] == [200, 200] and both[0][1]["usage"]["total_tokens"] <= MAX_POS
    assert both[1][1]["choices"][0] == call(hf.url + "/chat/completions", short)[1]["choices"][0]
    status, r = call(hf.url + "/chat/completions", chat("9" * MAX_POS, max_tokens=5))
    assert status == 400 and str(MAX_POS) in r["error"]["message"]
    status, r = call(hf.url + "/chat/completions", chat("12+34=", max_tokens=3, temperature=1.0, seed=5))
    assert status == 200 and r["usage"]["completion_tokens"] <= 3
    assert health(hf)["status"] == "ok"


def test_hf_answers_cut_at_max_tokens_reach_the_client_as_truncated(hf):
    """The hf backend says "length" when max_tokens cut the answer and "stop" when the model
    ended it; the client counts the first kind without a verdict as truncated, the second as
    unparseable (the random tiny model writes no box). One request at a time: each is generated
    alone, as the direct call that tells its finish_reason."""
    from reasonrl_fast.genrm.client import TRUNCATED, GenRMClient

    rng = random.Random(torch.initial_seed())
    asks = []
    for _ in range(8):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        steps, ans = addition_steps(a, b, 2)
        asks.append((make_prompt(a, b), str(ans), steps.split(",")))
    with GenRMClient([hf.url], template="compact", max_tokens=6, temperature=0, max_retries=0, timeout_s=60) as c:
        verdicts = [c.submit(*ask).result() for ask in asks]
        m = c.metrics()
    finishes = [call(hf.url + "/chat/completions", chat(render("compact", *ask), max_tokens=6, temperature=0))[1]
                ["choices"][0]["finish_reason"] for ask in asks]
    for v, finish in zip(verdicts, finishes):
        assert v.step is not None or v.error == (TRUNCATED if finish == "length" else "unparseable"), (v, finish)
    assert m["genrm/truncated"] == sum(v.truncated for v in verdicts) == finishes.count("length") > 0
    assert m["genrm/truncated"] + m["genrm/unparseable"] == m["genrm/failures"]


def test_hf_generate_failure_is_500_and_the_server_goes_on(tiny_dir):
    """In process (the fault is injected into the model): a failing generate answers its requests
    with 500, and the next request is served."""
    from aiohttp.test_utils import TestClient, TestServer

    from reasonrl_fast.genrm.hf_backend import HFBackend
    from reasonrl_fast.genrm.serve import make_app

    backend = HFBackend(tiny_dir, device="cpu")
    real, calls = backend.model.generate, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    backend.model.generate = flaky

    async def run() -> list[tuple[int, dict]]:
        async with TestClient(TestServer(make_app(backend, "tiny", None, "hf:tiny"), host="127.0.0.1")) as c:
            out = []
            for _ in range(2):
                r = await c.post("/v1/chat/completions", json=chat("12+34=", max_tokens=4, temperature=0))
                out.append((r.status, await r.json()))
            return out

    try:
        (s1, r1), (s2, r2) = asyncio.run(run())
    finally:
        backend.close()
    assert s1 == 500 and "illegal memory access" in r1["error"]["message"]
    assert s2 == 200 and 1 <= r2["usage"]["completion_tokens"] <= 4
    assert backend.stats()["generate_errors"] == 1 and backend.stats()["generate_calls"] == 1


# ---------------------------------------------------------------- launch


def test_bad_backend_fails_fast_and_clearly(tmp_path):
    for spec, words in [("rule:subtraction", "rule:addition"), ("vllm:x", "hf:PATH"),
                        (f"hf:{tmp_path}/absent", "no such directory"), (f"hf:{tmp_path}", "no config.json")]:
        t = time.monotonic()
        with pytest.raises(RuntimeError, match="exited with status 2") as e:
            launch(spec, start_timeout_s=30)
        assert words in str(e.value) and time.monotonic() - t < 15, (spec, str(e.value))
    with launch("rule:addition") as server, pytest.raises(RuntimeError, match="cannot listen") as e:
        launch("rule:addition", port=server.port, start_timeout_s=30)
    assert str(server.port) in str(e.value)


def test_child_dies_on_stop_on_kill_and_with_its_parent():
    server = launch("rule:addition")
    assert alive(server.pid)
    server.stop()
    assert not alive(server.pid) and server.proc.returncode == 0  # SIGTERM: a clean exit
    server = launch("rule:addition")
    server.kill()
    assert not alive(server.pid) and server.proc.returncode == -signal.SIGKILL
    os.unlink(server.log_path)  # kill() keeps the log (for the post-mortem of a fault)
    # a parent that is SIGKILLed takes its server with it (PR_SET_PDEATHSIG)
    code = "from reasonrl_fast.genrm.launch import launch; import time; s = launch('rule:addition'); " \
           "print(s.pid, s.log_path, flush=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        pid, log = parent.stdout.readline().split()
        pid = int(pid)
        assert alive(pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
        os.unlink(log)
    finally:
        parent.kill()
        parent.wait()


def test_genrm_imports_neither_torch_nor_the_trainer():
    """The client side runs in the trainer's driver and the rule server must start fast."""
    code = ("import sys, reasonrl_fast.genrm.serve, reasonrl_fast.genrm.launch, reasonrl_fast.protocol; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('transformers', "
            "'reasonrl_fast.trainer'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
