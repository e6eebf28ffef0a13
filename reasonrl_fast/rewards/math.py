"""Math answers (docs/math.md §Math answers): the last \\boxed{...} of a response, compared to
the ground truth mathematically (0.5 = \\frac{1}{2}, sets in any order, units stripped).

Plain numbers and simple fractions are compared exactly here; everything else goes to math-verify,
imported on first use (it pulls in sympy: about a second) so that importing this module stays
cheap in spawned workers. `dapo_score` is a second, deliberately different scorer: it reproduces
verl 0.9.1's DAPO rule (±1, textual after normalisation) so rewards match its runs; `boxed_score`
is the published FAPO runs' box-only variant of it.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from fractions import Fraction
from typing import Any

from reasonrl_fast.util import extract_boxed

__all__ = ["extract_boxed", "math_equal", "math_score", "compute_score", "dapo_score", "boxed_score"]

# ---------------------------------------------------------------------------------------------
# Equality

# Longest answer math-verify is asked about. MATH-500's longest answer has 159 characters; a
# "prediction" of thousands is not an answer, and parse time grows with length and nesting
# (deeply nested parentheses reach a time limit: benchmarks/RESULTS.md §4).
_MAX_ANSWER_CHARS = 500
# math-verify's own limits (whole seconds: it uses signal.alarm), per parse and per comparison.
_PARSE_TIMEOUT_S = 2
_VERIFY_TIMEOUT_S = 2

_SPACING = re.compile(r"\\[,;:! ]|\\q?quad(?![a-zA-Z])|\s+")
# Spaces a number may hold that do not change it: all but those between two digits ("1 2").
_NUMBER_SPACES = re.compile(r"(?<!\d) +| +(?!\d)")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)$")
_SLASH_FRACTION = re.compile(r"^([-+]?)(\d+)/(\d+)$")
_TEX_FRACTION = re.compile(r"^([-+]?)\\[dt]?frac(?:\{([-+]?\d+)\}\{([-+]?\d+)\}|(\d)(\d))$")


def _normalise(answer: str) -> str:
    """Cheap, meaning-preserving clean-up: spacing (to one space, as \\pi r must not become
    \\pir), surrounding $...$, a trailing full stop, thousands separators (1,000, 1{,}000)."""
    s = " ".join(_SPACING.sub(" ", answer).split())
    if len(s) >= 2 and s[0] == s[-1] == "$" and s.count("$") == 2:
        s = s[1:-1].strip()
    s = s.rstrip(". ")
    if _THOUSANDS.match(s):
        s = s.replace("{,}", "").replace(",", "")
    return s


def _exact_number(s: str) -> Fraction | None:
    """The exact value of an integer, decimal, a/b or \\frac{a}{b}; None for anything else."""
    s = _NUMBER_SPACES.sub("", s)
    try:
        if _DECIMAL.match(s):
            return Fraction(s)
        m = _SLASH_FRACTION.match(s) or _TEX_FRACTION.match(s)
        if m is None:
            return None
        sign, num, den = m.group(1), *(g for g in m.groups()[1:] if g is not None)
        value = Fraction(int(num), int(den))
        return -value if sign == "-" else value
    except (ValueError, ZeroDivisionError):  # 1/0, or more digits than int() accepts
        return None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _math_verify_equal(pred: str, truth: str) -> bool:
    from math_verify import parse, verify  # deferred: sympy is slow to import
    from math_verify.errors import TimeoutException

    # The time limits use SIGALRM, which only the main thread may set; elsewhere they are off
    # and the caller's pool has to end a hung comparison.
    main = _in_main_thread()
    parse_limit = _PARSE_TIMEOUT_S if main else None
    verify_limit = _VERIFY_TIMEOUT_S if main else None
    # math-verify cancels any alarm it finds (signal.alarm(0) when done); keep a caller's pending
    # alarm alive by re-arming what was left of it.
    outer_left = signal.alarm(0) if main else 0
    started = time.monotonic()
    try:
        gold = parse(f"${truth}$", parsing_timeout=parse_limit)
        if not gold:
            return False
        guess = parse(f"${pred}$", parsing_timeout=parse_limit)
        return bool(guess) and bool(verify(gold, guess, timeout_seconds=verify_limit))
    except TimeoutException:  # an alarm that fired just after math-verify's own handler ended
        return False
    finally:
        if outer_left:
            signal.alarm(max(1, outer_left - int(time.monotonic() - started)))


def math_equal(pred: str, truth: str) -> bool:
    """Whether `pred` is mathematically equal to `truth`. Never raises; False for anything it
    cannot decide (non-strings, empty, over-long, unparsable)."""
    if not isinstance(pred, str) or not isinstance(truth, str):
        return False
    try:
        p, t = _normalise(pred), _normalise(truth)
        if not p or not t:
            return False
        if p == t:
            return True
        if len(p) > _MAX_ANSWER_CHARS or len(t) > _MAX_ANSWER_CHARS:
            return False
        p_value, t_value = _exact_number(p), _exact_number(t)
        if p_value is not None and t_value is not None:
            return p_value == t_value  # exact: 0.333333 is not 1/3
        return _math_verify_equal(p, t)
    except Exception:  # noqa: BLE001 - a malformed answer is a wrong answer, not a crash
        return False


# ---------------------------------------------------------------------------------------------
# Scores

def math_score(response: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of `response` equals `ground_truth`, else 0.0."""
    pred = extract_boxed(response)
    return 1.0 if pred is not None and math_equal(pred, ground_truth) else 0.0


def _acceptable_answers(ground_truth: Any) -> list[str]:
    """The ground truth as a list of strings: a number is read as its string, a list (or a numpy
    array, as parquet lists arrive) holds several acceptable answers."""
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, bytes):
        return [ground_truth.decode("utf-8", errors="replace")]
    if hasattr(ground_truth, "tolist"):  # numpy scalar or array, without importing numpy
        ground_truth = ground_truth.tolist()
        if not isinstance(ground_truth, list):
            return _acceptable_answers(ground_truth)
    if isinstance(ground_truth, (list, tuple)):
        return [a for item in ground_truth for a in _acceptable_answers(item)]
    if ground_truth is None:
        return []
    return [str(ground_truth)]


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """{"score": 1.0 or 0.0, "acc": bool}: whether the last boxed answer equals the ground truth
    (or any of them, when it is a list)."""
    pred = extract_boxed(solution_str)
    right = pred is not None and any(math_equal(pred, t) for t in _acceptable_answers(ground_truth))
    return {"score": 1.0 if right else 0.0, "acc": right}


# ---------------------------------------------------------------------------------------------
# verl 0.9.1's DAPO rule (verl/utils/reward_score/math_dapo.py): only the
# last 300 characters count; the answer is the last "Answer: ..." line, normalised and compared
# as text, else (or in strict mode, only) the last \boxed{} in the final 100 characters, compared
# raw. The tables and rewrites below reproduce that module's normalisation, entry for entry and
# in its order, so that our rewards equal verl's (tests/rewards/test_math.py checks it
# against verl's own function on a few hundred responses).

_DAPO_TAIL_CHARS = 300
_DAPO_BOX_WINDOW = 100
_DAPO_INVALID = "[INVALID]"
_DAPO_ANSWER_LINE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
_DAPO_REPLACE = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_DAPO_DROP = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
    "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)
_DAPO_REWRITES = tuple((re.compile(p), r) for p, r in (
    (r".*?\$(.*?)\$.*", r"$\1$"),          # keep the first $...$ of each line
    (r"\\text\{(.*?)\}", r"\1"),
    (r"\\textbf\{(.*?)\}", r"\1"),
    (r"\\overline\{(.*?)\}", r"\1"),
    (r"\\boxed\{(.*)\}", r"\1"),
    (r"frac([^{])(.)", r"frac{\1}{\2}"),   # \frac12 -> \frac{1}{2}
    (r"sqrt([^{])", r"sqrt{\1}"),          # \sqrt2 -> \sqrt{2}
))
_PLAIN_BRACES = re.compile(r"[{}]")


def _dapo_normalise(answer: str) -> str:
    answer = answer.rpartition("=")[2]
    for old, new in _DAPO_REPLACE:
        answer = answer.replace(old, new)
    for junk in _DAPO_DROP:
        answer = answer.replace(junk, "")
    for pattern, replacement in _DAPO_REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _dapo_last_box(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces counted plainly (no escapes, no \\fbox)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    start += len("\\boxed{")
    depth = 1
    for brace in _PLAIN_BRACES.finditer(text, start):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[start:brace.start()]
    return None


def _dapo_box_verdict(text: str, ground_truth: str,
                      pause_tokens_index: list[int] | None) -> tuple[bool, str | None]:
    if pause_tokens_index is None:
        window = text[-_DAPO_BOX_WINDOW:]
    else:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 indices, got {pause_tokens_index!r}")
        # As in verl: a start below 0 counts from the end of the text.
        window = text[pause_tokens_index[-1] - _DAPO_BOX_WINDOW:]
    pred = _dapo_last_box(window)
    return pred == ground_truth, pred


def dapo_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
               pause_tokens_index: list[int] | None = None) -> dict:
    """{"score": 1.0 or -1.0, "acc": bool, "pred": extracted answer or None}, equal to verl
    0.9.1's math_dapo.compute_score for the same arguments (which raises where this raises
    ValueError: a pause_tokens_index whose length is not 4, when the box is looked at)."""
    tail = solution_str[-_DAPO_TAIL_CHARS:]
    if strict_box_verify:
        right, pred = _dapo_box_verdict(tail, ground_truth, pause_tokens_index)
    else:
        lines = _DAPO_ANSWER_LINE.findall(tail)
        pred = _dapo_normalise(lines[-1] if lines else _DAPO_INVALID)
        right = pred == _dapo_normalise(ground_truth)
        if pred == _DAPO_INVALID:
            box_right, box_pred = _dapo_box_verdict(tail, ground_truth, pause_tokens_index)
            if box_pred is not None:
                right, pred = box_right, box_pred
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}


# ---------------------------------------------------------------------------------------------
# The published FAPO runs' verifier (verl recipe/fapo/reward_fn_reasoning.py `verify`, behind
# both `compute_score_baseline` and the FAPO `compute_score`): the last \boxed{} in the last 300
# characters, normalised by the DAPO tables above and compared as text. No "Answer:" line is
# read: its data asks for a box only (data/prepare.py --boxed). Two departures, both where the
# published rule would reward nothing at all: no box is wrong even against a ground truth
# "[INVALID]" (its placeholder), and an answer that normalises to nothing is never right.

def boxed_score(solution_str: str, ground_truth: Any) -> dict:
    """{"score": 1.0 or -1.0, "acc": bool, "pred": the normalised box or None}; a list ground
    truth accepts any of its entries. Reads at most 300 characters of the response, whatever its
    length."""
    box = _dapo_last_box(solution_str[-_DAPO_TAIL_CHARS:]) if isinstance(solution_str, str) else None
    pred = _dapo_normalise(box) if box is not None else None
    right = bool(pred) and any(pred == _dapo_normalise(t) for t in _acceptable_answers(ground_truth))
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
