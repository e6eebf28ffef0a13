"""Rewards for math answers (SPEC.md §7): the last \\boxed{...} of the response, compared to the
ground truth numerically when both are plain numbers, else with math-verify. A reward function
that raises gives 0 for that sample and is counted (`reward/errors`), and training goes on."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from typing import Callable

_NUM = re.compile(r"^[-+]?\d+(\.\d+)?$")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed); None if there is none or it is
    unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _strip(s: str) -> str:
    return s.strip().replace(" ", "").rstrip(".").replace(",", "") if s else s


def is_equivalent(pred: str, truth: str) -> bool:
    p, t = _strip(pred), _strip(truth)
    if p == t:
        return True
    if _NUM.match(p) and _NUM.match(t):  # fast path: plain numbers, no parser needed
        return float(p) == float(t)
    from math_verify import parse, verify  # slow, general: fractions, sets, units, LaTeX

    gold = parse(f"${truth}$")
    ans = parse(f"${pred}$")
    return bool(gold) and bool(ans) and verify(gold, ans)


def math_reward(response: str, answer: str) -> float:
    """1.0 when the last boxed answer is mathematically equal to `answer`, else 0.0."""
    pred = last_boxed(response)
    return 1.0 if pred is not None and is_equivalent(pred, answer) else 0.0


def load_reward_fn(spec: str) -> Callable[[str, str], float]:
    """'' -> math_reward; 'package.module:function' or 'path/to/file.py:function' -> that
    function(response, answer). Each way it can fail names `data.reward_fn`."""
    if not spec:
        return math_reward
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"data.reward_fn={spec!r}: expected `module:function` or "
                         f"`path/to/file.py:function`")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise FileNotFoundError(f"data.reward_fn={spec!r}: no such file {where!r}")
        loader = importlib.util.spec_from_file_location(os.path.basename(where)[:-3], where)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(f"data.reward_fn={spec!r}: cannot import {where!r} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"data.reward_fn={spec!r}: {where!r} has no function {name!r}")
    return fn


def compute_rewards(fn: Callable[[str, str], float], responses: list[str], answers: list[str]) -> tuple[list[float], int]:
    """Rewards and the number of samples whose reward function raised (those get 0)."""
    out, errors = [], 0
    for r, a in zip(responses, answers):
        try:
            out.append(float(fn(r, a)))
        except Exception:  # noqa: BLE001 - a broken sample must not stop training
            out.append(0.0)
            errors += 1
    return out, errors
