"""Math answer scoring: the boxed answer, mathematical equality, scores that never hang or raise on
bad input, and the DAPO rule against verl 0.9.1's own function (run in its own venv)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from reasonrl_fast.rewards import math as rmath
from reasonrl_fast.rewards.math import (compute_score, dapo_score, extract_boxed, math_equal,
                                        math_score)
from tests.helpers.childproc import ROOT
from tests.helpers import verl_env

# Generous, so as not to flake: each bad input takes under 1.5 s here, except the power tower,
# which waits out math-verify's 2 s limit once in math_score and once in compute_score (4.0 s).
_BAD_INPUT_LIMIT_S = 10.0


def _rng() -> random.Random:
    # conftest seeds torch per test from the run's seed, so REASONRL_TEST_SEED replays this too.
    return random.Random(torch.initial_seed())


# --- extract_boxed -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\{1, \{2\}\}}", r"\{1, \{2\}\}"),
    (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),   # escaped braces need no partner
    (r"\fbox{7}", "7"),
    (r"\boxed{1} then \boxed{2} and finally \boxed{3}", "3"),
    (r"\boxed{1} \fbox{2}", "2"),
    (r"\fbox{1} \boxed{2}", "2"),
    (r"\boxed{}", ""),
    (r"\boxed{1} \boxed{2", None),        # the last one is unclosed
    (r"\boxed{", None),
    (r"\boxed{{}", None),
    ("no box here, 42", None),
    ("", None),
    (r"\boxed 5", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_is_linear_on_deep_nesting():
    depth = 10_000
    t0 = time.monotonic()
    assert extract_boxed("\\boxed{" * depth + "x" + "}" * depth) == "x"  # the last opener
    assert extract_boxed("\\boxed{" * depth) is None
    assert extract_boxed("\\boxed{" + "{" * 10**6) is None
    assert extract_boxed("\\boxed{" + "a" * 10**6 + "}") == "a" * 10**6
    assert time.monotonic() - t0 < _BAD_INPUT_LIMIT_S


# --- math_equal --------------------------------------------------------------------------------

@pytest.mark.parametrize("pred, truth", [
    ("0.5", r"\frac{1}{2}"),
    (r"\frac12", "0.5"),
    (r"-\dfrac{3}{4}", "-0.75"),
    ("2/4", r"\tfrac{1}{2}"),
    ("1,000", "1000"),
    ("1{,}000,000", "1000000"),
    ("  42 ", "42"),
    ("$42$", "42"),
    ("42.", "42"),
    ("042", "42"),
    (r"\{3, 1, 2\}", r"\{1,2,3\}"),
    ("3, 1, 2", "1,2,3"),
    (r"5\text{ cm}", "5"),
    (r"12 \text{ dollars}", "12"),
    (r"30^\circ", "30"),
    (r"\sqrt{8}", r"2\sqrt{2}"),
    (r"\pi r^2", r"r^2 \pi"),
    (r"x = 3", "3"),
    (r"\infty", r"\infty"),
    ("[0, 1)", "[0,1)"),
])
def test_math_equal_true(pred, truth):
    assert math_equal(pred, truth)


@pytest.mark.parametrize("pred, truth", [
    ("3", "4"),
    ("0.333333", r"\frac{1}{3}"),    # exact, not rounded
    (r"\frac{1}{2}", "0.49"),
    ("-5", "5"),
    ("1,000", "100"),
    ("1 2", "12"),
    ("(1, 2)", "(2, 1)"),            # a tuple keeps its order
    (r"\{1, 2\}", r"\{1, 2, 3\}"),
    (r"\sqrt{2}", "2"),
    ("A", "B"),
    ("", "1"),
    ("1", ""),
    ("", ""),
    ("1/0", "1"),
])
def test_math_equal_false(pred, truth):
    assert not math_equal(pred, truth)


def test_plain_numbers_need_no_math_verify(monkeypatch):
    asked = []
    monkeypatch.setattr(rmath, "_math_verify_equal", lambda p, t: asked.append((p, t)) or False)
    for pred, truth, equal in [("0.5", r"\frac{1}{2}", True), ("1,000", "1000", True),
                               ("-3/6", "-0.5", True), (r"\dfrac{10}{4}", "2.50", True),
                               ("1{,}234.5", "1234.50", True), ("7", "7.0001", False)]:
        assert math_equal(pred, truth) is equal, (pred, truth)
    assert asked == []
    assert not math_equal(r"\sqrt{4}", "2") and asked == [(r"\sqrt{4}", "2")]  # not plain: asked


def test_math_equal_never_raises():
    for pred, truth in [(None, "1"), ("1", None), (1, "1"), (b"1", "1"), ("1" * 5000, "1" * 4999),
                        ("\ud800\x00", "1"), ("\\frac{", "1"), ("}}}{{{", "1"), ("$", "$$")]:
        assert math_equal(pred, truth) is False


def test_math_equal_caps_the_length_sent_to_math_verify():
    long_but_equal = "+".join(["1"] * 300) + "-299"           # 1 as a long sum
    assert len(long_but_equal) > rmath._MAX_ANSWER_CHARS
    assert not math_equal(long_but_equal, "1")
    assert math_equal("1+1+1-2", "1")                        # the same kind of answer, short


def test_math_equal_off_the_main_thread():
    # math-verify's time limits use signals, which only the main thread may set: elsewhere they
    # must be switched off rather than make every comparison fail.
    out: dict = {}

    def run():
        try:
            out["set"] = math_equal(r"\{2, 1\}", r"\{1, 2\}")
            out["wrong"] = math_equal(r"\sqrt{3}", r"\sqrt{2}")
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert out == {"set": True, "wrong": False}


def test_math_equal_keeps_a_pending_alarm():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.alarm(30)
        assert math_equal(r"\{2, 1\}", r"\{1, 2\}")
        left = signal.alarm(0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert 0 < left <= 30 and not fired


# --- scores ------------------------------------------------------------------------------------

def test_math_score_and_compute_score():
    response = r"Half of one is \boxed{1} -- no wait, it is \boxed{\frac{1}{2}}."
    assert math_score(response, "0.5") == 1.0
    assert math_score(response, "1") == 0.0
    assert math_score("The answer is 0.5", "0.5") == 0.0        # not boxed
    assert compute_score(response, "0.5") == {"score": 1.0, "acc": True}
    assert compute_score(response, "2") == {"score": 0.0, "acc": False}
    assert compute_score(r"\boxed{5}", 5) == {"score": 1.0, "acc": True}  # a number: its string
    assert compute_score(r"\boxed{0.5}", 0.5)["acc"]
    assert compute_score(r"\boxed{4}", ["3", "4"], extra_info={"index": 0})["acc"]
    assert compute_score(r"\boxed{4}", np.array(["3", "4"]))["acc"]  # a list read from parquet
    assert compute_score(r"\boxed{4}", np.int64(4))["acc"]
    assert not compute_score(r"\boxed{5}", ["3", "4"])["acc"]
    assert not compute_score(r"\boxed{5}", [])["acc"]
    assert not compute_score(r"\boxed{5}", None)["acc"]
    assert type(compute_score(r"\boxed{5}", "5")["acc"]) is bool


_NO_DIGITS = str.maketrans("", "", "0123456789")


def _garbage(rng: random.Random, n: int) -> str:
    raw = bytes(rng.getrandbits(8) for _ in range(n)).decode("utf-8", errors="replace")
    # No ASCII digits: about 1.5 % of random strings hold a real answer such as "U=2", which
    # math-verify rightly reads as 2; these cases are about robustness, not about the parser.
    raw = raw.translate(_NO_DIGITS)
    return raw + "\x00\ud800\udfff\x00" + raw[::-1]


_BAD_RESPONSES = {
    "huge": lambda rng: "The answer is " + "x" * 10**6,
    "huge_boxed": lambda rng: "\\boxed{" + "1" * 10**6 + "}",
    "huge_boxed_expression": lambda rng: "\\boxed{" + "+".join(["1"] * 500_000) + "}",
    "deeply_nested": lambda rng: "\\boxed{" * 10**4 + "1" + "}" * 10**4,
    "deeply_nested_unclosed": lambda rng: "\\boxed{" * 10**4 + "1",
    "brace_flood": lambda rng: "\\boxed{" + "{" * 10**6,
    "garbage": lambda rng: _garbage(rng, 20_000),
    "boxed_garbage": lambda rng: "\\boxed{" + _garbage(rng, 150) + "}",
    "unclosed": lambda rng: "so the answer is \\boxed{1",
    "empty": lambda rng: "",
    "nested_parens": lambda rng: "\\boxed{" + "(" * 200 + ")" * 200 + "}",
    "power_tower": lambda rng: "\\boxed{9^{9^{9^{9}}}}",   # math-verify's own time limit ends it
}


@pytest.mark.parametrize("name", sorted(_BAD_RESPONSES))
def test_bad_input_scores_zero_quickly(name):
    response = _BAD_RESPONSES[name](_rng())
    t0 = time.monotonic()
    assert math_score(response, "2") == 0.0
    assert compute_score(response, "2") == {"score": 0.0, "acc": False}
    for strict in (False, True):
        result = dapo_score(response, "2", strict_box_verify=strict)
        assert result["score"] == -1.0 and result["acc"] is False
    elapsed = time.monotonic() - t0
    assert elapsed < _BAD_INPUT_LIMIT_S, f"{name}: {elapsed:.1f} s"


@pytest.mark.proc
def test_import_stays_cheap():
    # Scorers run in spawned workers: importing this module must not pull in sympy or torch.
    code = ("import sys, reasonrl_fast.rewards.math; "
            "print(sorted(m for m in ('torch', 'sympy', 'math_verify') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- DAPO rule, against verl's own function ------------------------------------------------------

# (ground truth, forms of it a response may give that the rule counts as right or not)
_DAPO_ANSWERS = [
    ("42", ["42", "42.", "$42$", r"\boxed{42}", "x = 42", "x = y = 42", "42 = x",
            r"42 \text{ units}", "42 dollars", r"\$42", r"\textbf{42}", "the answer is 42",
            "42\t", r"\boxed{4}2}"]),
    ("42\n", ["42", "42\n", " 42"]),
    ("1000", ["1,000", "1000", "1{,}000", "1,00,0", r"1\,000"]),
    (r"\frac{1}{2}", [r"\frac{1}{2}", r"\frac12", r"\dfrac{1}{2}", "1/2", "0.5", r"\boxed{\frac{1}{2}}",
                      r"$\frac{1}{2}$ so", r"\frac{1}{2}."]),
    ("30", [r"30^\circ", r"30^{\circ}", "30 degrees", r"\text{30}", "thirty"]),
    (r"\sqrt{2}", [r"\sqrt2", r"\sqrt{2}", r"2^{1/2}", r"\overline{\sqrt{2}}", r"$\sqrt$2",
                   r"\sqrt{}", r"$\sqrt$"]),
    ("5", [r"5\text{ cm}", r"5 \mbox{ cm}", "5 cm", "a 5", "an 5", r"5\;", "5 sue", r"\text{(5)}"]),
    ("(1,2)", ["(1,2)", "(1, 2)", "(2,1)", r"(1,\!2)", r"(1\text{ and }2)"]),
    ("-7", ["-7", "- 7", r"\boxed{-7}", "7", r"-7\ldots"]),
    ("[INVALID]", ["[INVALID]", "INVALID"]),
    ("", ["", " "]),
]
_FILLER_WORDS = ["so", "then", "we", "get", "x", "=", "2", "{", "}", "$y$", r"\frac{a}{b}",
                 "the", "sum", "is", "\n", "answer", "therefore", "Let", "boxed"]


def _filler(rng: random.Random, n_chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < n_chars:
        words.append(rng.choice(_FILLER_WORDS))
    return " ".join(words)


def _dapo_response(rng: random.Random, form: int, given: str, other: str) -> str:
    """One response in one of the forms the DAPO rule tells apart."""
    pre = _filler(rng, rng.choice([0, 20, 150, 400, 900]))      # > 300: the tail cut matters
    post = _filler(rng, rng.choice([0, 5, 60, 120, 280]))        # > 100: the box window matters
    label = rng.choice(["Answer:", "Answer: ", "answer :", "ANSWER:\n", "Final Answer: "])
    return [
        f"{pre}\n{label}{given}",
        f"{pre} \\boxed{{{given}}}",
        f"{pre} \\boxed{{{given}}}{post}",
        f"{pre} \\boxed{{{other}}} then \\boxed{{{given}}}{post}",
        f"{pre} \\boxed{{{given}}} then \\boxed{{{other}}}",
        f"{pre}\n{label}{given}\n{post} \\boxed{{{other}}}",
        f"{pre}\n{label}{other}\n{label}{given}",
        f"{pre}\n{label}{given}\n{post}",
        f"{pre} {post}",                                              # no answer at all
        f"{pre} \\boxed{{{given}",                                    # unclosed
        f"{pre}\n{label}\n",                                          # an empty answer line
        f"{label}{given}\n{_filler(rng, 400)} \\boxed{{{given}}}",   # the line is cut away
        f"{pre} \\fbox{{{given}}}",
        f"{pre} $\\boxed{{{given}}}$ {label}{given}",
    ][form]


_DAPO_FORMS = 14


def _dapo_cases(rng: random.Random) -> list[dict]:
    cases = []
    for form in range(_DAPO_FORMS):
        for strict in (False, True):
            for _ in range(12):
                truth, givens = rng.choice(_DAPO_ANSWERS)
                given = rng.choice(givens + [truth])
                other = rng.choice(rng.choice(_DAPO_ANSWERS)[1])
                case = {"solution_str": _dapo_response(rng, form, given, other),
                        "ground_truth": truth, "strict_box_verify": strict}
                kind = rng.random()
                if kind < 0.25:
                    case["pause_tokens_index"] = [rng.randrange(-50, 400) for _ in range(4)]
                elif kind < 0.3:
                    case["pause_tokens_index"] = [rng.randrange(400)]  # wrong length: both raise
                cases.append(case)
    return cases


def _dapo_catalogue_cases() -> list[dict]:
    """Every listed form of every answer, as an answer line and boxed, both modes: the random
    cases need not draw each one."""
    return [{"solution_str": text, "ground_truth": truth, "strict_box_verify": strict}
            for truth, givens in _DAPO_ANSWERS for given in givens
            for text in (f"So.\nAnswer: {given}", f"So \\boxed{{{given}}}.")
            for strict in (False, True)]


def _dapo_boundary_cases() -> list[dict]:
    """Answers that start just inside and just outside the 300-character tail and the
    100-character box window: random lengths rarely land on an edge."""
    cases = []
    for marker, edge, strict in [("\nAnswer: 42", 300, False), ("\\boxed{42}", 100, False),
                                 ("\\boxed{42}", 100, True)]:
        for offset in range(-2, 3):  # the marker starts edge + offset characters from the end
            tail = "\n" + "." * (edge + offset - len(marker) - 1)
            cases.append({"solution_str": "So " * 60 + marker + tail, "ground_truth": "42",
                          "strict_box_verify": strict})
    return cases


@pytest.fixture(scope="module")
def verl_reference(verl_python):
    """(cases, verl's answers, verl's normalisation tables)."""
    cases = _dapo_cases(_rng()) + _dapo_catalogue_cases() + _dapo_boundary_cases()
    answers, tables = verl_env.verl_dapo_scores(verl_python, cases)
    return cases, answers, tables


def test_dapo_tables_are_verls(verl_reference):
    _, _, tables = verl_reference
    assert list(rmath._DAPO_REPLACE) == [tuple(pair) for pair in tables["SUBSTITUTIONS"]]
    assert list(rmath._DAPO_DROP) == tables["REMOVED_EXPRESSIONS"]


def test_dapo_score_equals_verls(verl_reference):
    cases, answers, _ = verl_reference
    assert len(cases) >= 300
    ours = []
    for case in cases:
        try:
            ours.append({"result": dapo_score(**case)})
        except ValueError:
            ours.append({"error": "raised"})
    mismatches = []
    for case, mine, theirs in zip(cases, ours, answers):
        if "error" in theirs:
            theirs = {"error": "raised"}  # verl asserts; we raise ValueError
        if mine != theirs or ("result" in mine and type(mine["result"]["acc"]) is not bool):
            mismatches.append((case, mine, theirs))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ, e.g. {mismatches[:3]}"

    # The cases reach every outcome of the rule, so equality above means something.
    results = [a["result"] for a in answers if "result" in a]
    strict_right = [c for c, a in zip(cases, answers)
                    if c["strict_box_verify"] and a.get("result", {}).get("acc")]
    assert len(strict_right) >= 5
    assert sum(r["acc"] for r in results) >= 30
    assert sum(not r["acc"] for r in results) >= 30
    assert sum(r["pred"] is None for r in results) >= 5
    assert sum(r["pred"] == "[INVALID]" for r in results) >= 5
    assert sum("error" in a for a in answers) >= 5
    assert sum(len(c["solution_str"]) > 300 for c in cases) >= 100
