"""The embedded partition task (`data.task=partition`): write a number of `data.digits` digits as
the sum of two positive numbers. Every prompt has many right answers (57 = 23+34 = 47+10 = 39+18
= ...), which is what separates matching the reward distribution (FlowRL) from maximising it
(GRPO): the first should keep several right answers per prompt, the second may settle on one.

Prompt `split 57:`; response: the split column by column from the left, then the two numbers
boxed, `5:2+3,7:3+4 \\boxed{23+34}`, scored by `partition_score` below (any two positive numbers
with that sum are right, also those the columns cannot show, like 39+18). Each column is a
digit's own split, so a model that learns it handles numbers it never saw: a fifth of the
numbers (digit sum a multiple of 5) never appear in training or in the warm start, and make the
validation split. The warm start's demonstrations favour one way of splitting (each digit in
halves) over two others (the first digit less one and the rest, then any split), and slip on
one column in some of them, so the warm start is both narrower and less accurate than the task
allows."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from reasonrl_fast.config.checks import Checks, fail
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.tasks.base import Task
from reasonrl_fast.util import extract_boxed

STYLES = ("halves", "tens", "any")
"""How the warm start's demonstrations split each digit; `data.partition.styles` weighs them
(by default 0.6, 0.3, 0.1: a narrow warm start)."""
SLIP_PROB = 0.35
"""A demonstration writes one column's second digit off by one this often (the boxed numbers
follow the columns, so their sum is wrong): room for RL to raise accuracy."""


def numbers(digits: int, part: str) -> list[int]:
    """The training or held-out validation targets: `digits`-digit numbers whose first digit is
    at least 2 (so both numbers keep every column), held out when their digit sum is a multiple
    of 5."""
    every = range(2 * 10 ** (digits - 1), 10**digits)
    held = [n for n in every if sum(map(int, str(n))) % 5 == 0]
    return held if part == "val" else [n for n in every if sum(map(int, str(n))) % 5]


def make_prompt(n: int) -> str:
    return f"split {n}:"


def columns(rng: random.Random, n: int, weights=(0.6, 0.3, 0.1)) -> list[tuple[int, int]]:
    """(a_i, b_i) per digit of n, from the left, in one of STYLES drawn with `weights`: a_i + b_i
    is the digit, and the first column leaves both numbers a non-zero first digit."""
    style = rng.choices(STYLES, weights=weights)[0]
    out = []
    for i, ch in enumerate(str(n)):
        d = int(ch)
        lo, hi = (1, d - 1) if i == 0 else (0, d)
        a = {"halves": max(lo, d // 2), "tens": hi if i else d - 1}.get(style) if style != "any" else None
        a = rng.randint(lo, hi) if a is None else a
        out.append((a, d - a))
    return out


def work(cols: list[tuple[int, int]], digits: str | None = None) -> str:
    """[(2, 3), (3, 4)] -> '5:2+3,7:3+4 \\boxed{23+34}'. Each column is labelled with its digit of
    `digits` (the target), or by default with its own sum."""
    labels = digits or [x + y for x, y in cols]
    a = "".join(str(x) for x, _ in cols)
    b = "".join(str(y) for _, y in cols)
    return ",".join(f"{d}:{x}+{y}" for d, (x, y) in zip(labels, cols, strict=True)) + f" \\boxed{{{a}+{b}}}"


def demonstration(rng: random.Random, d) -> tuple[str, str]:
    """(prompt, response) of one warm-start example on a training number."""
    n = rng.choice(numbers(d.digits, "train"))
    cols = columns(rng, n, d.partition.styles)
    if rng.random() < SLIP_PROB:  # one column's second digit off by one, staying a digit
        i = rng.randrange(len(cols))
        x, y = cols[i]
        step = rng.choice((-1, 1))
        low = 1 if i == 0 else 0
        cols[i] = (x, y + step if low <= y + step <= 9 else y - step)
    # the columns keep the target's digits as labels: a slipped column still looks right
    return make_prompt(n), work(cols, str(n))


def split(d, n: int, seed: int, part: str = "train") -> list[dict]:
    """`n` records drawn (seeded) from the training or the held-out numbers."""
    rng = random.Random(seed)
    pool = numbers(d.digits, part)
    chosen = [rng.choice(pool) for _ in range(n)]
    return [{"prompt": make_prompt(t), "answer": json.dumps({"target": t, "parts": 2}),
             "data_source": Partition.source} for t in chosen]


def budgets(digits: int) -> tuple[int, int]:
    """Tokens of the longest prompt and of the longest response with its end token."""
    top = 10**digits - 1
    return len(make_prompt(top)), len(work([(9, 0)] * digits)) + 1


def check_config(cfg) -> None:
    """The prompt and response lengths a partition problem and its answer need
    (data.partition.styles and data.digits are checked with their sections)."""
    prompt, response = budgets(cfg.data.digits)
    for key, have, need in (("data.max_prompt_length", cfg.data.max_prompt_length, prompt),
                            ("rollout.max_new_tokens", cfg.rollout.max_new_tokens, response)):
        if have < need:
            raise ConfigError(f"{key}={have}: data.task=partition with data.digits={cfg.data.digits} "
                              f"needs >= {need}")


# ---------------------------------------------------------------- the reward (docs/math.md §Partition reward)
# Write a target as the sum of a given number of positive integers, in the last \boxed{}:
# `\boxed{23+34}` for 57 in 2 parts. The ground truth is JSON `{"target": T, "parts": k}`. Only the
# boxed answer counts, and only in its exact form: k positive integers in ASCII digits without
# leading zeros, joined by `+` (spaces allowed around them), whose sum is T. A bare number,
# another count of parts, a zero part, a leading zero, a digit of another script, a sign,
# brackets or anything else scores 0.

MAX_PARTS = 16
MAX_DIGITS = 18
"""Longest part read (a ground truth's target has at most this many digits too)."""

_PART = rf"[1-9][0-9]{{0,{MAX_DIGITS - 1}}}"
_ANSWER = re.compile(rf"[ ]*{_PART}(?:[ ]*\+[ ]*{_PART})*[ ]*")  # ASCII only: no \d, no \s
_MAX_BOX = MAX_PARTS * (MAX_DIGITS + 3)


def parse_truth(ground_truth: Any) -> tuple[int, int]:
    """(target, parts) of a ground truth; ValueError naming what is wrong."""
    try:
        truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        target, parts = truth["target"], truth["parts"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(f'a partition ground truth is JSON {{"target": T, "parts": k}}, '
                         f"got {ground_truth!r:.80}") from None
    if not (type(target) is int and type(parts) is int and 1 <= parts <= MAX_PARTS
            and parts <= target < 10**MAX_DIGITS):
        raise ValueError(f"partition ground truth {ground_truth!r:.80}: needs integers with "
                         f"1 <= parts <= {MAX_PARTS} and parts <= target < 10^{MAX_DIGITS}")
    return target, parts


def partition_parts(solution_str: str) -> list[int] | None:
    """The parts of the last boxed answer when it has the exact form, else None."""
    box = extract_boxed(solution_str)
    if box is None or len(box) > _MAX_BOX or not _ANSWER.fullmatch(box):
        return None
    return [int(p) for p in box.split("+")]


def partition_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """{"score": 1.0 or 0.0, "acc"} of one answer."""
    target, parts = parse_truth(ground_truth)
    got = partition_parts(solution_str)
    right = got is not None and len(got) == parts and sum(got) == target
    return {"score": float(right), "acc": right}


# ---------------------------------------------------------------- the task


@dataclass
class PartitionConfig(Checks):
    """The partition task's settings (`data.partition.*`), read with data.task=partition."""

    styles: list[float] = field(default_factory=lambda: [0.6, 0.3, 0.1])
    """How often the warm start's demonstrations split each digit in halves, as the first digit
    less one and the rest, or at random (relative weights; [1, 1, 1]: an even mix, a flatter warm
    start)."""

    def check(self, at: str = "data.partition.") -> None:
        w = self.styles
        if len(w) != len(STYLES) or any(x < 0 for x in w) or not sum(w) > 0:
            fail(f"{at}styles", w, f"needs {len(STYLES)} weights ({', '.join(STYLES)}), finite, >= 0, not all 0")


class Partition(Task):
    name = source = "partition"
    section, Settings = "partition", PartitionConfig
    scorer = f"{__name__}:partition_score"  # its own scorer, run by the reward workers

    def sft_key(self, d) -> tuple:  # 2: demonstration version; the default mix keeps its old key
        return ("partition", 2, tuple(zip(STYLES, map(float, d.partition.styles))), SLIP_PROB)

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:
        return split(d, n, seed, part)

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        return demonstration(rng, d)

    def check_config(self, cfg) -> None:
        check_config(cfg)
