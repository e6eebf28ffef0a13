"""The embedded multiply task (`data.task=multiply`): products, some the tiny model can learn to
answer at once and some it cannot without a tool. Prompt `37*48=`, response `\\boxed{1776}`, or
with a call of the calculator first (the plain call form, tools/calls.py):
`<calculator>37*48</calculator><result>1776</result>\\boxed{1776}`.

Two kinds of problems: "head", both factors from 2 to `data.multiply.head_max` (a table of a few
dozen products the warm start teaches), and "tool", both factors of `data.multiply.tool_digits`
digits (thousands of products: no small model holds them). The warm start's demonstrations call
the calculator on a share of the problems of either kind (`data.multiply.call_frac`) and answer
the others at once, so the warm start calls about as often on both kinds; RL with the calculator
among `rollout.tools` can learn to call where it pays (the tool problems). A call costs the turn
and its tokens from the response's budget. Its validation reports the accuracy and the call rate
of each kind (`val_metrics`)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from reasonrl_fast.config.checks import Checks, fail
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.tasks.base import Task

SOURCE = "multiply"
KINDS = ("head", "tool")
CALL = "<calculator>{}</calculator>"
RESULT = "<result>{}</result>"
"""The plain call form and its observation (tools/calls.py `Plain`), as the demonstrations
write them."""


def make_prompt(a: int, b: int) -> str:
    return f"{a}*{b}="


def factors(rng: random.Random, d, kind: str) -> tuple[int, int]:
    m = d.multiply
    if kind == "head":
        return rng.randint(2, m.head_max), rng.randint(2, m.head_max)
    lo, hi = 10 ** (m.tool_digits - 1), 10 ** m.tool_digits - 1
    return rng.randint(lo, hi), rng.randint(lo, hi)


def split(d, n: int, seed: int, part: str = "train") -> list[dict]:
    """`n` records, each "tool" with probability data.multiply.tool_frac (train and validation
    draw alike, from their own seeds)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = "tool" if rng.random() < d.multiply.tool_frac else "head"
        a, b = factors(rng, d, kind)
        out.append({"prompt": make_prompt(a, b), "answer": str(a * b), "data_source": SOURCE, "kind": kind})
    return out


def demonstration(rng: random.Random, d) -> tuple[str, str]:
    """(prompt, response) of one warm-start example: a call of the calculator with probability
    data.multiply.call_frac, else the product at once."""
    kind = "tool" if rng.random() < d.multiply.tool_frac else "head"
    a, b = factors(rng, d, kind)
    call = CALL.format(f"{a}*{b}") + RESULT.format(a * b) if rng.random() < d.multiply.call_frac else ""
    return make_prompt(a, b), f"{call}\\boxed{{{a * b}}}"


_CALLED = re.compile(re.escape(CALL.split("{}")[0]))


def called(response: str) -> bool:
    """Whether a response calls the calculator."""
    return _CALLED.search(response) is not None


def val_metrics(items: list[dict], texts: list[str], acc: list[bool]) -> dict:
    """val/multiply_<kind>_accuracy and val/multiply_<kind>_call_rate for each kind that has
    records among `items`."""
    out = {}
    for kind in KINDS:
        mine = [i for i, it in enumerate(items) if it.get("data_source") == SOURCE and it.get("kind") == kind]
        if mine:
            out[f"val/multiply_{kind}_accuracy"] = sum(bool(acc[i]) for i in mine) / len(mine)
            out[f"val/multiply_{kind}_call_rate"] = sum(called(texts[i]) for i in mine) / len(mine)
    return out


def budgets(d) -> tuple[int, int]:
    """Tokens of the longest prompt and of the longest demonstrated response with its end token."""
    m = d.multiply
    top = max(m.head_max, 10 ** m.tool_digits - 1)
    return len(make_prompt(top, top)), len(CALL.format(make_prompt(top, top)[:-1]) + RESULT.format(top * top)
                                             + f"\\boxed{{{top * top}}}") + 1


@dataclass
class MultiplyConfig(Checks):
    """The multiply task's settings (`data.multiply.*`), read with data.task=multiply."""

    head_max: int = 9
    """The "head" problems' factors run from 2 to this (9: the 64 products of a times table)."""
    tool_digits: int = 2
    """Digits of each factor of a "tool" problem."""
    tool_frac: float = 0.5
    """The share of "tool" problems, in training, validation and the warm start."""
    call_frac: float = 0.3
    """The share of the warm start's demonstrations that call the calculator (of either kind)."""

    def check(self, at: str = "data.multiply.") -> None:
        if not 2 <= self.head_max <= 99:
            fail(f"{at}head_max", self.head_max, "needs 2 <= head_max <= 99")
        if not 1 <= self.tool_digits <= 6:
            fail(f"{at}tool_digits", self.tool_digits, "needs 1 <= tool_digits <= 6")
        for key in ("tool_frac", "call_frac"):
            v = getattr(self, key)
            if not 0 <= v <= 1:
                fail(f"{at}{key}", v, "needs a share in [0, 1]")


class Multiply(Task):
    name = source = SOURCE
    section, Settings = "multiply", MultiplyConfig
    scorer = "math"  # the last \boxed{} against the product

    def sft_key(self, d) -> tuple:
        m = d.multiply
        return ("multiply", 1, m.head_max, m.tool_digits, float(m.tool_frac), float(m.call_frac))

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:
        return split(d, n, seed, part)

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        return demonstration(rng, d)

    def val_metrics(self, items: list[dict], texts: list[str], acc: list[bool]) -> dict:
        return val_metrics(items, texts, acc)

    def check_config(self, cfg) -> None:
        prompt, response = budgets(cfg.data)
        for key, have, need in (("data.max_prompt_length", cfg.data.max_prompt_length, prompt),
                                ("rollout.max_new_tokens", cfg.rollout.max_new_tokens, response)):
            if have < need:
                raise ConfigError(f"{key}={have}: data.task=multiply with data.multiply.tool_digits="
                                  f"{cfg.data.multiply.tool_digits} needs >= {need}")
