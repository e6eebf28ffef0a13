"""The embedded multiply task: its records and kinds, the warm start's demonstrations with and
without a calculator call (the call and its observation as the plain format writes and the
calculator answers them), its validation metrics per kind, and the lengths it needs."""

import random

import pytest

from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.rewards.score import default_compute_score
from reasonrl_fast.tasks import get_task
from reasonrl_fast.tasks.multiply import called
from reasonrl_fast.tools.calculator import calculator
from reasonrl_fast.tools.calls import FORMATS

RUN = ["data.task=multiply", "rollout.max_new_tokens=72"]


def test_records_are_products_of_either_kind():
    cfg = load_config(None, RUN)
    task = get_task("multiply")
    items = task.split(cfg.data, 400, 0)
    kinds = [it["kind"] for it in items]
    assert 0.4 < kinds.count("tool") / len(kinds) < 0.6
    for it in items:
        a, b = map(int, it["prompt"][:-1].split("*"))
        assert it["prompt"].endswith("=") and it["answer"] == str(a * b) and it["data_source"] == "multiply"
        assert (2 <= a <= 9 and 2 <= b <= 9) if it["kind"] == "head" else (10 <= a <= 99 and 10 <= b <= 99)
    assert task.split(cfg.data, 50, 1) != task.split(cfg.data, 50, 2)


def test_demonstrations_call_on_a_share_and_score_right():
    cfg = load_config(None, RUN)
    task, rng = get_task("multiply"), random.Random(0)
    calls = 0
    for _ in range(300):
        prompt, response = task.demonstration(rng, cfg.data)
        a, b = map(int, prompt[:-1].split("*"))
        assert default_compute_score("multiply", response, str(a * b))["acc"]
        if called(response):
            calls += 1
            call, rest = response.split("</calculator>", 1)
            turn = call + "</calculator>"
            (c,) = FORMATS["plain"].parse(turn, ["calculator"])
            assert rest.startswith(FORMATS["plain"].observe([calculator(c.arguments)]))  # what the rollout appends
        else:
            assert response == f"\\boxed{{{a * b}}}"
    assert 0.2 < calls / 300 < 0.4


def test_validation_reports_accuracy_and_calls_per_kind():
    items = [{"data_source": "multiply", "kind": "head"}, {"data_source": "multiply", "kind": "tool"},
             {"data_source": "multiply", "kind": "tool"}, {"data_source": "addition"}]
    texts = ["\\boxed{6}", "<calculator>12*13</calculator><result>156</result>\\boxed{156}", "\\boxed{1}", "x"]
    got = get_task("multiply").val_metrics(items, texts, [True, True, False, True])
    assert got == {"val/multiply_head_accuracy": 1.0, "val/multiply_head_call_rate": 0.0,
                   "val/multiply_tool_accuracy": 0.5, "val/multiply_tool_call_rate": 0.5}


def test_the_run_must_hold_a_call():
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=32: data.task=multiply .* needs >= 6"):
        load_config(None, ["data.task=multiply"])
    load_config(None, [*RUN, "data.multiply.tool_digits=3", "rollout.max_new_tokens=90", "data.max_prompt_length=16"])
