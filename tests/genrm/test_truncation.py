"""Answers cut at max_tokens are counted apart (genrm/truncated) from other answers without a
verdict (genrm/unparseable), end to end: our server reports finish_reason "length" when
max_tokens cut the answer, the client reads it, the judge's warning says so. And the "published"
template through a real server: the raw response in the published prompt, the sampling sent, the
published verdict rule applied, and the rule judge's refusal of a prompt without steps."""

from __future__ import annotations

import pytest

from reasonrl_fast.config import load_config
from reasonrl_fast.genrm.client import TRUNCATED, GenRMClient
from reasonrl_fast.genrm.launch import launch
from reasonrl_fast.genrm.serve import make_app
from reasonrl_fast.protocol import Completion, Sampling, last_user_text, parse_request
from reasonrl_fast.tasks.addition import addition_steps, first_wrong_step, make_prompt, parse_problem
from reasonrl_fast.trainer.fapo import Judge
from tests.helpers.loopback import app_server

pytestmark = pytest.mark.proc  # real servers on loopback

FAST = dict(max_retries=0, timeout_s=10, backoff_base_s=0.01, backoff_max_s=0.02)


class Scripted:
    """A backend for our server's app: answers each message with `answer(text)`, cut at
    max_tokens characters with finish_reason "length" (as a model does at its token limit), and
    keeps what it was asked."""

    default_name = "scripted"

    def __init__(self, answer) -> None:
        self.answer = answer
        self.seen: list[tuple[str, Sampling]] = []

    async def complete(self, messages, sampling: Sampling) -> Completion:
        text = last_user_text(messages)
        self.seen.append((text, sampling))
        out = self.answer(text)
        if sampling.max_tokens is not None and len(out) > sampling.max_tokens:
            return Completion(out[: sampling.max_tokens], "length", len(text), sampling.max_tokens)
        return Completion(out, "stop", len(text), len(out))

    def stats(self) -> dict:
        return {}


@pytest.fixture
def serve():
    """serve(backend) -> address of our server's app around it (or of an aiohttp app given as it
    is), on a thread of this process."""
    from aiohttp import web

    with app_server() as start:
        yield lambda backend: start(backend if isinstance(backend, web.Application)
                                    else make_app(backend, backend.default_name, None, "scripted"))


@pytest.fixture(scope="module")
def rule():
    with launch("rule:addition") as server:
        yield server


def requests(n: int, first: int = 21) -> list[tuple[str, str, list[str]]]:
    out = []
    for i in range(n):
        a, b = first + i, 34 + 2 * i
        work, ans = addition_steps(a, b, 2, miswrite_at=i % 2 if i % 3 == 0 else None)
        out.append((make_prompt(a, b), str(ans), work.split(",")))
    return out


def test_the_rule_server_reports_a_cut_answer_and_the_client_counts_it_apart(rule):
    asks = requests(6)
    with GenRMClient([rule.url], template="compact", max_tokens=5, **FAST) as c:
        cut = c.judge(asks)
        m = c.metrics()
    assert all(v.step is None and v.error == TRUNCATED and v.truncated and v.attempts == 1 for v in cut), cut
    assert (m["genrm/failures"], m["genrm/truncated"], m["genrm/unparseable"], m["genrm/retries"]) == (6, 6, 0, 0)
    # the same requests with room for the answer: every verdict, none cut
    with GenRMClient([rule.url], template="compact", max_tokens=500, **FAST) as c:
        whole = c.judge(asks)
        m = c.metrics()
    want = [first_wrong_step(*parse_problem(p), steps) for p, _, steps in asks]
    assert [v.step for v in whole] == want and any(w >= 0 for w in want) and -1 in want
    assert (m["genrm/failures"], m["genrm/truncated"], m["genrm/unparseable"]) == (0, 0, 0)


def test_cut_and_unreadable_answers_are_told_apart(serve):
    """Through our server's app: a long answer without a box cut at max_tokens is truncated; a
    short one without a box is unparseable; a verdict that came before the cut is a verdict."""
    def answer(text: str) -> str:
        a = parse_problem(parse_request(text)[0])[0]
        return {0: "Let me check each column. " * 20,            # no box before the cut
                1: "I cannot tell.",                              # no box, not cut
                2: "\\boxed{-1} " + "and that is all. " * 20}[a % 3]  # the box, then cut
    backend = Scripted(answer)
    address = serve(backend)
    asks = requests(9)
    with GenRMClient([address], template="compact", max_tokens=40, **FAST) as c:
        verdicts = c.judge(asks)
        m = c.metrics()
    kinds = [parse_problem(p)[0] % 3 for p, _, _ in asks]
    assert [v.error for v in verdicts] == [{0: TRUNCATED, 1: "unparseable", 2: ""}[k] for k in kinds]
    assert [v.step for v in verdicts] == [-1 if k == 2 else None for k in kinds]
    assert m["genrm/truncated"] == kinds.count(0) == 3 and m["genrm/unparseable"] == kinds.count(1) == 3
    assert m["genrm/failures"] == 6 and all(s.max_tokens == 40 for _, s in backend.seen)


def test_the_judge_says_how_many_were_cut_and_names_max_tokens(rule):
    lines: list[str] = []
    cfg = load_config(None, ["algo=fapo", f"fapo.genrm.addresses=[{rule.url}]", "fapo.genrm.max_retries=0",
                             "fapo.genrm.max_tokens=5"])
    judge = Judge(cfg, log=lines.append)
    try:
        for i, (problem, answer, steps) in enumerate(requests(4)):
            judge.submit(i, {"prompt": problem, "answer": answer, "data_source": "addition"},
                         ",".join(steps) + f" \\boxed{{{answer}}}")
        verdicts, metrics = judge.collect()
    finally:
        judge.close()
    assert all(v.truncated for v in verdicts.values())
    assert metrics["genrm/truncated"] == metrics["genrm/failures"] == 4 and metrics["genrm/unparseable"] == 0
    (line,) = lines
    assert "4 of 4 GenRM verdicts failed" in line and "truncated: 4" in line, line
    assert "4 of them reached fapo.genrm.max_tokens=5 before a verdict" in line, line


def test_published_template_through_the_judge(serve):
    """The message holds the raw response in the published prompt, the sampling is sent, and any
    boxed integer but -1 flags (7 names no step of a two-paragraph response: still flawed)."""
    backend = Scripted(lambda text: "Step 1 is wrong. \\boxed{7}" if "2+2 = 5" in text
                       else "Every step holds. \\boxed{ -1 }")
    address = serve(backend)
    cfg = load_config(None, ["algo=fapo", f"fapo.genrm.addresses=[{address}]", "fapo.genrm.template=published",
                             "fapo.genrm.max_retries=0", "fapo.genrm.max_tokens=16384",
                             "fapo.genrm.temperature=0.7", "fapo.genrm.top_p=0.8", "fapo.genrm.timeout_s=300"])
    responses = ["  First, 2+2 = 4.\n\nSo the answer is \\boxed{4}.\n", "We get 2+2 = 5,\n\nyet \\boxed{4}."]
    item = {"prompt": "What is 2+2?", "answer": "4", "data_source": "math"}
    lines: list[str] = []
    judge = Judge(cfg, log=lines.append)
    try:
        for i, r in enumerate(responses):
            judge.submit(i, item, r)
        verdicts, metrics = judge.collect()
    finally:
        judge.close()
    assert (verdicts[0].step, verdicts[0].flawed) == (-1, False)
    assert (verdicts[1].step, verdicts[1].flawed) == (7, True)
    assert metrics["fapo/flagged_ratio"] == 0.5 and metrics["genrm/failures"] == 0 and lines == []
    by_response = {r: (text, s) for r in responses for text, s in backend.seen if r in text}
    for r in responses:
        text, s = by_response[r]
        assert text.startswith("The following is a math problem with its ground truth answer")
        assert "[Math Problem]\n\nWhat is 2+2?\n\n[Ground Truth]\n\n4\n\n[AI Solution]\n\n" + r + "\n\nYour task" in text
        assert (s.max_tokens, s.temperature, s.top_p) == (16384, 0.7, 0.8)


def test_the_rule_server_refuses_a_published_request_by_name(rule):
    with GenRMClient([rule.url], template="published", max_tokens=100, **FAST) as c:
        (v,) = c.judge([("12+34=", "46", ["2+4=6", "1+3=4"], "2+4=6,1+3=4 \\boxed{46}")])
        m = c.metrics()
    assert v.step is None and v.attempts == 1 and v.error.startswith("http 400: messages: a 'published'"), v
    assert m["genrm/failures"] == 1 and m["genrm/truncated"] == m["genrm/unparseable"] == 0


def test_a_null_answer_cut_at_the_limit_is_truncated_not_retried(serve):
    """What vLLM sends when max_tokens ends a reasoning model's thinking (its reasoning parser puts
    the text aside): content null, finish_reason "length". Retrying would be cut again."""
    from aiohttp import web

    calls = []

    async def chat(request):
        calls.append(await request.json())
        return web.json_response({"choices": [{"index": 0, "finish_reason": "length",
                                               "message": {"role": "assistant", "content": None,
                                                           "reasoning_content": "Step 0 looks"}}]})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    address = serve(app)
    with GenRMClient([address], model="m", template="compact", max_tokens=8, **{**FAST, "max_retries": 2}) as c:
        (v,) = c.judge(requests(1))
        m = c.metrics()
    assert (v.step, v.error, v.attempts, len(calls)) == (None, TRUNCATED, 1, 1)
    assert (m["genrm/truncated"], m["genrm/unparseable"], m["genrm/retries"]) == (1, 0, 0)
