"""The partition reward: write a target as the sum of a given number of positive integers, in the
last \\boxed{}: `\\boxed{23+34}` for 57 in 2 parts. Many answers are right (57 has 56 ordered
pairs), so the task measures whether a policy keeps several of them.

The ground truth is JSON `{"target": T, "parts": k}`. Only the boxed answer counts, and only in
its exact form: k positive integers in ASCII digits without leading zeros, joined by `+` (spaces
allowed around them), whose sum is T. A bare number, another count of parts, a zero part, a
leading zero, a digit of another script, a sign, brackets or anything else scores 0
(docs/math.md §Partition reward)."""

from __future__ import annotations

import json
import re
from typing import Any

from reasonrl_fast.util import extract_boxed

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
