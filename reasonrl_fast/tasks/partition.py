"""The embedded partition task (`data.task=partition`): write a number of `data.digits` digits as
the sum of two positive numbers. Every prompt has many right answers (57 = 23+34 = 47+10 = 39+18
= ...), which is what separates matching the reward distribution (FlowRL) from maximising it
(GRPO): the first should keep several right answers per prompt, the second may settle on one.

Prompt `split 57:`; response: the split column by column from the left, then the two numbers
boxed, `5:2+3,7:3+4 \\boxed{23+34}`, scored by rewards/partition.py (any two positive numbers
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

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.tasks.base import Task

SOURCE = "partition"
STYLES = (("halves", 0.6), ("tens", 0.3), ("any", 0.1))
"""How the warm start's demonstrations split each digit, and how often."""
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


def columns(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """(a_i, b_i) per digit of n, from the left, in one of STYLES: a_i + b_i is the digit, and the
    first column leaves both numbers a non-zero first digit."""
    style = rng.choices([s for s, _ in STYLES], weights=[w for _, w in STYLES])[0]
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
    cols = columns(rng, n)
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
    return [{"prompt": make_prompt(t), "answer": json.dumps({"target": t, "parts": 2}), "data_source": SOURCE}
            for t in chosen]


def budgets(digits: int) -> tuple[int, int]:
    """Tokens of the longest prompt and of the longest response with its end token."""
    top = 10**digits - 1
    return len(make_prompt(top)), len(work([(9, 0)] * digits)) + 1


def check_config(cfg) -> None:
    if cfg.data.digits < 1:
        raise ConfigError(f"data.digits={cfg.data.digits}: data.task=partition needs >= 1")
    prompt, response = budgets(cfg.data.digits)
    for key, have, need in (("data.max_prompt_length", cfg.data.max_prompt_length, prompt),
                            ("rollout.max_new_tokens", cfg.rollout.max_new_tokens, response)):
        if have < need:
            raise ConfigError(f"{key}={have}: data.task=partition with data.digits={cfg.data.digits} "
                              f"needs >= {need}")


TASK = Task(name="partition", source=SOURCE, split=split, demonstration=demonstration,
            sft_key=("partition", 2, STYLES, SLIP_PROB), check_config=check_config)  # 2: demonstration version
