"""The embedded addition task: prompts `AB+CD=`, answers worked column by column from the last
digit ('7+5=12,4+8+1=13 \\boxed{132}'), and the noisy demonstrations of the warm start."""

from __future__ import annotations

import random
import re

from reasonrl_fast.protocol import RequestError, parse_request
from reasonrl_fast.tasks.base import Task

SOURCE = "addition"

# ---------------------------------------------------------------- synthetic task


def addition_steps(a: int, b: int, digits: int, slip_at: int | None = None,
                   miswrite_at: int | None = None) -> tuple[str, int]:
    """Column addition from the last digit, one step per column: '7+5=12,4+8+1=13,...'.

    `slip_at`: index of a column whose incoming carry is forgotten (a noisy demonstration);
    the final answer then follows the slip, so the written work stays self-consistent.
    `miswrite_at`: index of a column whose sum is written with a wrong tens digit (see
    `miswrite`) while the carry and the final answer stay right: a flawed positive.
    Returns (steps, the answer the steps arrive at).
    """
    da, db = str(a).zfill(digits)[::-1], str(b).zfill(digits)[::-1]
    carry, out, steps = 0, [], []
    for i in range(digits):
        if i == slip_at:
            carry = 0
        s = int(da[i]) + int(db[i]) + carry
        written = miswrite(s) if i == miswrite_at else str(s)
        steps.append(f"{da[i]}+{db[i]}" + ("+1" if carry else "") + f"={written}")
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
                      "data_source": SOURCE})
    return items


def sft_example(a: int, b: int, digits: int, slip_prob: float, rng: random.Random,
                flaw_prob: float = 0.0) -> str:
    """A supervised demonstration. With probability `slip_prob` one carry is forgotten (a wrong
    answer); otherwise, with probability `flaw_prob`, one carrying column's sum is written with a
    wrong tens digit while the answer stays right (a flawed positive)."""
    carries = [i for i in range(1, digits) if _carry_into(a, b, digits, i)]
    slip = rng.choice(carries) if carries and rng.random() < slip_prob else None
    # columns that carry into the next one (not the last: its tens digit is the answer's first)
    out = [i - 1 for i in carries]
    flaw = rng.choice(out) if slip is None and out and flaw_prob and rng.random() < flaw_prob else None
    steps, ans = addition_steps(a, b, digits, slip, flaw)
    return f"{steps} \\boxed{{{ans}}}"


def _carry_into(a: int, b: int, digits: int, col: int) -> bool:
    m = 10**col
    return (a % m) + (b % m) >= m


# ---------------------------------------------------------------- flawed positives and the step checker
# A flawed positive is a right final answer reached through a wrong step (FAPO). The embedded
# task gets them from demonstrations that write a carrying column's sum with a wrong tens digit,
# '7+5=22,4+8+1=13 \boxed{132}': the step is false, but nothing later reads the tens digit
# except as "there is a carry", so the answer stays right. Two flaws that later steps do read
# were tried first and measured on the default GRPO run: a dropped carry digit ('7+5=2') and a
# miswritten operand ('7+6=12'). The policy's flaws then caused its errors, and GRPO alone
# removed them (benchmarks/RESULTS.md §6), leaving FAPO nothing to do.


def miswrite(total: int) -> str:
    """A column's sum written with a wrong tens digit: 12 -> '22' (7 -> '17'). For a column that
    carries into the next one, the last digit (the answer's) and a non-zero tens digit (the
    carry the next column adds) stay as they were: the demonstrations miswrite only those."""
    return str(total + 10)


def column_steps(a: int, b: int, digits: int) -> list[str]:
    """The right steps of a + b, one per column from the last digit."""
    return addition_steps(a, b, digits)[0].split(",")


def response_steps(response: str) -> list[str]:
    """The steps a response writes: the comma-separated text before its first \\boxed (one empty
    step when there is none, so that a judge always has a step to point at)."""
    work = response.split("\\boxed", 1)[0].strip()
    return [s.strip() for s in work.split(",")]


MAX_OPERAND_DIGITS = 1000
"""Longest operand `parse_problem` reads (the task's have a few digits; Python refuses to convert
a string of more than 4300 digits, and the conversion's time grows with the square of it)."""

# The first match must start where a run of digits starts: without the look-behind, a long run
# not followed by '+' is tried again from each of its digits (time growing with the square of the
# run: benchmarks/RESULTS.md §5); possessive runs are read once.
_PROBLEM = re.compile(r"(?<![0-9])([0-9]++)\+([0-9]++)=")


def parse_problem(problem: str) -> tuple[int, int] | None:
    """(a, b) of an addition prompt 'a+b=' (surrounding text ignored), or None; ValueError for an
    operand longer than MAX_OPERAND_DIGITS. Linear time in the text's length."""
    m = _PROBLEM.search(problem)
    if m is None:
        return None
    if max(len(m.group(1)), len(m.group(2))) > MAX_OPERAND_DIGITS:
        raise ValueError(f"an operand has {max(len(m.group(1)), len(m.group(2)))} digits "
                         f"(at most {MAX_OPERAND_DIGITS})")
    return int(m.group(1)), int(m.group(2))


def first_wrong_step(a: int, b: int, steps: list[str]) -> int:
    """Index of the earliest step that differs from the right column work, or -1 if none. A
    missing step counts as wrong at the last written one; an extra step is wrong where it
    starts; no steps at all (or one empty step) is wrong at 0."""
    right = column_steps(a, b, max(len(str(a)), len(str(b))))
    for i in range(max(len(steps), len(right))):
        if i >= len(steps):
            return max(len(steps) - 1, 0)
        if i >= len(right) or steps[i] != right[i]:
            return i
    return -1


def flawed_step(prompt: str, response: str) -> int:
    """The step checker: index of the earliest wrong step of `response` to the addition
    `prompt`, or -1 when every step is right (the ground truth of the flawed-positive metrics)."""
    ab = parse_problem(prompt)
    if ab is None:
        raise ValueError(f"not an addition prompt: {prompt[:80]!r}")
    return first_wrong_step(*ab, response_steps(response))


# ---------------------------------------------------------------- the rule judge (genrm.serve's rule:addition)


def judge_addition(text: str) -> tuple[str, int, int]:
    """(answer, verdict, number of steps) for a GenRM request about the addition task. The answer
    reasons a line per step up to the verdict, then boxes it."""
    req = parse_request(text)
    if req is None:
        raise RequestError("messages: the last user message is not a GenRM request (expected the 'fapo' or "
                           "'compact' rendering of protocol.render)", "messages")
    problem, _, steps = req
    try:
        ab = parse_problem(problem)
    except ValueError as e:
        raise RequestError(f"messages: the problem cannot be judged: {e}", "messages") from None
    if ab is None:
        raise RequestError(f"messages: the problem is not an addition 'a+b=': {problem[:80]!r}", "messages")
    a, b = ab
    steps = [s.strip() for s in steps]
    verdict = first_wrong_step(a, b, steps)
    right = column_steps(a, b, max(len(str(a)), len(str(b))))
    lines = [] if steps else ["No steps are written."]
    for i, step in enumerate(steps[: (verdict + 1) if verdict >= 0 else len(steps)]):
        if i != verdict:
            lines.append(f"Step {i}: {step} is right.")
        elif i >= len(right):
            lines.append(f"Step {i}: {step} is wrong: the sum was already complete.")
        elif step != right[i]:
            lines.append(f"Step {i}: {step} is wrong: it should be {right[i]}.")
        else:  # right as written, but the work stops here with columns left
            lines.append(f"Step {i}: {step} is the last step, but {right[i + 1]} is missing after it.")
    if verdict == -1:
        lines.append(f"All {len(steps)} steps are right.")
    answer = "\n".join(lines + [f"\\boxed{{{verdict}}}"])
    return answer, verdict, len(steps)


# ---------------------------------------------------------------- the task


def demonstration(rng: random.Random, d) -> tuple[str, str]:
    """(prompt, response) of one warm-start example: an addition worked column by column, noisy
    as `d` (the data config) says (slips and flaws)."""
    a, b = sample_operands(rng, d.digits, d.carry_frac)
    return make_prompt(a, b), sft_example(a, b, d.digits, d.carry_slip_prob, rng, d.flaw_prob)


def flawed_positive_ratio(items: list[dict], texts: list[str], acc: list[bool]) -> dict:
    """val/flawed_positive_ratio: the share of right responses to addition records whose steps
    are wrong (by the step checker); {} without addition records."""
    mine = [i for i, it in enumerate(items) if it.get("data_source") == SOURCE]
    if not mine:
        return {}
    right = [i for i in mine if acc[i]]
    flawed = sum(flawed_step(items[i]["prompt"], texts[i]) != -1 for i in right)
    return {"val/flawed_positive_ratio": flawed / len(right) if right else 0.0}


class Addition(Task):
    name, source, scorer = "addition", SOURCE, "math"
    genrm_template = "compact"
    step_checker = staticmethod(flawed_step)
    rule_judge = staticmethod(judge_addition)

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:  # train and val: draws alike
        return synthetic_split(n, d.digits, seed, d.carry_frac)

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        return demonstration(rng, d)

    def request_steps(self, response: str) -> list[str]:
        return response_steps(response)

    def val_metrics(self, items: list[dict], texts: list[str], acc: list[bool]) -> dict:
        return flawed_positive_ratio(items, texts, acc)
