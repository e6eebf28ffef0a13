"""The `calculator` tool: arithmetic on integers and decimals, exact for integers of any size
up to a bound, read with Python's own parser and evaluated node by node (nothing but numbers and
operators: no names, calls or attributes, so no way out of the expression)."""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 1000
"""The longest expression read."""
MAX_DIGITS = 1000
"""The largest integer any step may reach, in decimal digits (a power's size is checked before
it is computed)."""

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_LIMIT = 10 ** MAX_DIGITS


def calculator(expression: str) -> str:
    """
    Evaluate an arithmetic expression and return its value: integers and decimals, the operators + - * / // % ** and parentheses.

    Args:
        expression: The expression, for example "37*48" or "(2+3)**2/7".
    """
    if not isinstance(expression, str):
        raise TypeError(f"expression must be text, got {type(expression).__name__}")
    text = expression.strip()
    if len(text) > MAX_CHARS:
        raise ValueError(f"the expression has {len(text)} characters (at most {MAX_CHARS})")
    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except (SyntaxError, MemoryError, RecursionError):  # the parser's own nesting limits
        raise ValueError(f"not an arithmetic expression: {text[:80]!r}") from None
    try:
        value = _eval(tree.body)
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("the result is not a finite number")
        return repr(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.12g}"
    return str(value)


def _eval(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("the result is too large") from None
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def _check_power(base, exp) -> None:
    """Refuse a power whose result would pass MAX_DIGITS before computing it (2**10**9 would take
    the worker's memory and minutes first)."""
    if isinstance(base, complex) or isinstance(exp, complex):
        raise ValueError("complex numbers are not supported")
    if base == 0 and exp < 0:
        raise ValueError("division by zero")
    if abs(exp) > 10 * MAX_DIGITS * 4 or (abs(base) > 1 and abs(exp) * math.log10(abs(base)) > MAX_DIGITS):
        raise ValueError(f"the result would have more than {MAX_DIGITS} digits")


def _checked(value):
    if isinstance(value, complex):  # (-8) ** 0.5
        raise ValueError("the result is not a real number")
    if isinstance(value, int) and abs(value) >= _LIMIT:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    return value
