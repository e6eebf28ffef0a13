"""The embedded addition task: prompts `AB+CD=`, answers worked column by column from the last
digit ('7+5=12,4+8+1=13 \\boxed{132}'), and the noisy demonstrations of the warm start."""

from __future__ import annotations

import random

# ---------------------------------------------------------------- synthetic task


def addition_steps(a: int, b: int, digits: int, slip_at: int | None = None) -> tuple[str, int]:
    """Column addition from the last digit, one step per column: '7+5=12,4+8+1=13,...'.

    `slip_at`: index of a column whose incoming carry is forgotten (a noisy demonstration);
    the final answer then follows the slip, so the written work stays self-consistent.
    Returns (steps, the answer the steps arrive at).
    """
    da, db = str(a).zfill(digits)[::-1], str(b).zfill(digits)[::-1]
    carry, out, steps = 0, [], []
    for i in range(digits):
        if i == slip_at:
            carry = 0
        s = int(da[i]) + int(db[i]) + carry
        steps.append(f"{da[i]}+{db[i]}" + ("+1" if carry else "") + f"={s}")
        out.append(str(s % 10))
        carry = s // 10
    if carry:
        out.append("1")
    return ",".join(steps), int("".join(reversed(out)))


def make_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def has_carry(a: int, b: int, digits: int) -> bool:
    return any(_carry_into(a, b, digits, i) for i in range(1, digits))


def sample_operands(rng: random.Random, digits: int, carry_frac: float) -> tuple[int, int]:
    """Two `digits`-digit numbers; with probability `carry_frac` the sum needs a carry between
    columns (the step that demonstrations get wrong), else it needs none (rejection sampling)."""
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    want = rng.random() < carry_frac
    while True:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if has_carry(a, b, digits) == want:
            return a, b


def synthetic_split(n: int, digits: int, seed: int, carry_frac: float = 0.75) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        a, b = sample_operands(rng, digits, carry_frac)
        items.append({"prompt": make_prompt(a, b), "answer": str(a + b), "a": a, "b": b,
                      "data_source": "addition"})
    return items


def sft_example(a: int, b: int, digits: int, slip_prob: float, rng: random.Random) -> str:
    """A supervised demonstration; with probability `slip_prob` one carry is forgotten."""
    carries = [i for i in range(1, digits) if _carry_into(a, b, digits, i)]
    slip = rng.choice(carries) if carries and rng.random() < slip_prob else None
    steps, ans = addition_steps(a, b, digits, slip)
    return f"{steps} \\boxed{{{ans}}}"


def _carry_into(a: int, b: int, digits: int, col: int) -> bool:
    m = 10**col
    return (a % m) + (b % m) >= m
