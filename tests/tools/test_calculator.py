"""The calculator tool: exact arithmetic, and every way out of an expression refused with a
ValueError the policy reads (the tool box turns it into an error observation)."""

import time

import pytest

from reasonrl_fast.tools.calculator import MAX_DIGITS, calculator


@pytest.mark.parametrize("expr, want", [
    ("37*48", "1776"), (" 2 + 3 * 4 ", "14"), ("(2+3)**2/5", "5"), ("7/2", "3.5"), ("7//2", "3"), ("-7 % 3", "2"),
    ("2^10", "1024"), ("123456789123456789*987654321987654321", str(123456789123456789 * 987654321987654321)),
    ("1/3", "0.333333333333"), ("-(-5)", "5"), ("2**-2", "0.25"), ("1e3+1", "1001"),
])
def test_it_computes(expr, want):
    assert calculator(expr) == want


@pytest.mark.parametrize("expr, why", [
    ("__import__('os').system('id')", "only numbers"), ("x+1", "only numbers"), ("(1).__class__", "only numbers"),
    ("lambda: 1", "only numbers"), ("[1, 2]", "only numbers"), ("'a'*3", "only numbers"), ("True+1", "only numbers"),
    ("1j*1j", "only numbers"), ("1/0", "division by zero"), ("0**-1", "division by zero"),
    ("2**10**9", "digits"), ("9**9**9**9", "digits"), ("10**999*10**999", "digits"), ("(-8)**0.5", "real"),
    ("1e308*10", "finite"), ("1+", "not an arithmetic expression"), ("", "not an arithmetic expression"),
    ("1" * 2000, "characters"), ("(" * 400 + "1" + ")" * 400, "not an arithmetic"), ("-" * 990 + "1", "nested"),
])
def test_a_way_out_or_a_blow_up_is_a_value_error_at_once(expr, why):
    t = time.perf_counter()
    with pytest.raises(ValueError, match=why):
        calculator(expr)
    assert time.perf_counter() - t < 1.0


def test_the_largest_result_it_gives():
    assert len(calculator(f"10**{MAX_DIGITS - 1}")) == MAX_DIGITS
    with pytest.raises(ValueError):
        calculator(f"10**{MAX_DIGITS}")
    with pytest.raises(TypeError):
        calculator(12)
