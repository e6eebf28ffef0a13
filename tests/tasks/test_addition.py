"""The embedded addition task's flawed positives and its step checker."""

import random

import pytest

from reasonrl_fast.tasks.addition import (addition_steps, first_wrong_step, flawed_step, miswrite, parse_problem,
                                         response_steps, sft_example)
from reasonrl_fast.rewards.math import math_score


def _operands(rng, digits):
    return rng.randint(10 ** (digits - 1), 10**digits - 1), rng.randint(10 ** (digits - 1), 10**digits - 1)


@pytest.mark.parametrize("digits", [1, 2, 3, 5])
def test_checker_finds_the_miswritten_column(digits):
    rng = random.Random(digits)
    for _ in range(300):
        a, b = _operands(rng, digits)
        clean, ans = addition_steps(a, b, digits)
        assert ans == a + b
        assert flawed_step(f"{a}+{b}=", f"{clean} \\boxed{{{ans}}}") == -1
        col = rng.randrange(digits)
        steps, ans2 = addition_steps(a, b, digits, miswrite_at=col)
        # A flawed positive: the answer is right, the column's written sum is not.
        assert ans2 == a + b and steps != clean
        response = f"{steps} \\boxed{{{ans2}}}"
        assert math_score(response, str(a + b)) == 1.0
        assert flawed_step(f"{a}+{b}=", response) == col


def test_checker_on_slips_and_malformed_work():
    # 47+85: columns 7+5=12, 4+8+1=13
    p = "47+85="
    assert flawed_step(p, "7+5=12,4+8=12 \\boxed{122}") == 1  # the forgotten carry
    assert flawed_step(p, "7+5=12 \\boxed{132}") == 0  # a missing step: wrong at the last written
    assert flawed_step(p, "\\boxed{132}") == 0  # no work at all
    assert flawed_step(p, "7+5=12,4+8+1=13,0+0=0 \\boxed{132}") == 2  # an extra step
    assert flawed_step(p, "7+5=12, 4+8+1=13 \\boxed{132}") == -1  # spaces around steps are fine
    assert flawed_step(p, "7+5=12,4+8+1=13") == -1  # steps without a box are still judged
    with pytest.raises(ValueError, match="not an addition prompt"):
        flawed_step("hello", "7+5=12")


def test_miswrite_changes_only_the_tens_digit():
    for s in range(19):
        w = miswrite(s)
        assert int(w) != s and int(w) % 10 == s % 10 and (int(w) >= 10) and (s < 10 or int(w) // 10 > 1)
    assert addition_steps(47, 85, 2, miswrite_at=0) == ("7+5=22,4+8+1=13", 132)


def test_demonstrations_miswrite_only_columns_that_carry_on():
    rng = random.Random(3)
    for _ in range(500):
        a, b = _operands(rng, 3)
        d = sft_example(a, b, 3, 0.0, rng, flaw_prob=1.0)
        k = flawed_step(f"{a}+{b}=", d)
        right = addition_steps(a, b, 3)[0].split(",")
        if k == -1:  # no column carries into the next one
            assert not any(int(s.split("=")[1]) >= 10 for s in right[:-1])
        else:
            assert k < 2 and int(right[k].split("=")[1]) >= 10


def test_helpers():
    assert parse_problem("47+85=") == (47, 85) and parse_problem("x") is None
    assert response_steps(" 7+5=12,4+8+1=13 \\boxed{132}") == ["7+5=12", "4+8+1=13"]
    assert response_steps("\\boxed{1}") == [""]  # one empty step: a judge can point at it
    assert first_wrong_step(5, 7, ["5+7=12"]) == -1


def test_demonstrations_mix_clean_slipped_and_flawed():
    rng = random.Random(0)
    kinds = {"clean": 0, "slip": 0, "flawed": 0}
    for _ in range(2000):
        a, b = 47, 85
        d = sft_example(a, b, 2, 0.5, rng, flaw_prob=0.4)
        right, bad = math_score(d, "132") == 1.0, flawed_step("47+85=", d) != -1
        assert right or bad  # a wrong answer always comes from a wrong step
        kinds["slip" if not right else "flawed" if bad else "clean"] += 1
    # slip 0.5 (this sum has a carry into the tens), then flawed 0.4 of the rest: 0.5 / 0.2 / 0.3
    assert abs(kinds["slip"] / 2000 - 0.5) < 0.05
    assert abs(kinds["flawed"] / 2000 - 0.2) < 0.04
    assert abs(kinds["clean"] / 2000 - 0.3) < 0.04
    # flaw_prob 0 draws nothing extra: the demonstrations are the ones before flaws existed
    r1, r2 = random.Random(5), random.Random(5)
    assert [sft_example(47, 85, 2, 0.5, r1) for _ in range(50)] == \
        [sft_example(47, 85, 2, 0.5, r2, flaw_prob=0.0) for _ in range(50)]
