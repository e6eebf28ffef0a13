"""The box-only scorer of the published FAPO data (`math_dapo_boxed`, `math-dapo`): routing, the
{score, acc} contract, answers written to fool it, inputs large enough to hang a careless
scorer, and the published verifier itself (verl's helpers, in its own venv)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from reasonrl_fast.rewards.math import boxed_score, dapo_score
from reasonrl_fast.rewards.score import default_compute_score, scorer_for
from tests.helpers import verl_env

BOX = "\\boxed{42}"


@pytest.mark.parametrize("source, kind", [
    ("math_dapo_boxed", "boxed"), ("math-dapo", "boxed"), ("MATH_DAPO_BOXED", "boxed"),
    ("math_dapo", "dapo"), ("aime24", "dapo"), ("math_dapo_boxed_v2", "math"), ("math", "math"),
])
def test_routing(source, kind):
    assert scorer_for(source) == kind


def test_the_contract_is_plus_or_minus_one():
    """±1 as the published baseline's reward (GRPO uses the score); FAPO reads only `acc`."""
    assert default_compute_score("math_dapo_boxed", f"so {BOX}.", "42") == {"score": 1.0, "acc": True}
    assert default_compute_score("math-dapo", "so \\boxed{41}.", "42") == {"score": -1.0, "acc": False}
    out = boxed_score(f"so {BOX}", "42")
    assert out == {"score": 1.0, "acc": True, "pred": "42"} and type(out["acc"]) is bool


def _pad(n: int) -> str:
    return "." * n


# (response, ground truth, right?) with why, each written to fool a scorer that reads the wrong box
HOSTILE = [
    (f"\\boxed{{7}} then {BOX}", "42", True),                       # several boxes: the last counts
    (f"{BOX} no wait, \\boxed{{7}}", "42", False),                  # a right box early, another at the end
    (f"{BOX} and finally \\boxed{{4", "42", False),                 # the last box is unclosed
    (BOX + _pad(300 - len(BOX)), "42", True),                      # starts exactly 300 from the end
    (BOX + _pad(301 - len(BOX)), "42", False),                     # starts 301 from the end: outside
    (BOX + _pad(5000), "42", False),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),               # nested braces
    ("\\boxed{\\frac12}", "\\frac{1}{2}", True),                   # DAPO's shorthand rewrite
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", False),               # one brace short
    ("\\boxed{{42}}", "42", False),                                # verl keeps the inner braces
    ("\\boxed{}", "42", False),                                    # empty
    ("\\boxed{}", "", False),                                      # empty never right, even against ""
    ("\\boxed{ }", " ", False),
    ("Answer: 42", "42", False),                                   # an Answer line is not read
    ("Answer: 42\n\\boxed{7}", "42", False),                       # ... even when it disagrees with the box
    (f"Answer: 7\n{BOX}", "42", True),
    ("no answer at all", "[INVALID]", False),                      # no box against the placeholder
    ("\\fbox{42}", "42", False),                                   # only \boxed{ counts
    ("\\boxed 42", "42", False),
    ("\\boxed{x = 42}", "42", True),                               # normalised as published: after "="
    (f"$ {BOX} $", "42", True),
    (BOX, ["41", "42"], True),                                     # a list accepts any entry
    (BOX, 42, True),                                               # a number is read as its string
    (None, "42", False),
]


@pytest.mark.parametrize("response, truth, right", HOSTILE)
def test_hostile_answers(response, truth, right):
    out = boxed_score(response, truth)
    assert out["acc"] is right and out["score"] == (1.0 if right else -1.0), out


def test_box_only_is_not_the_dapo_rule():
    """The DAPO rule reads an "Answer:" line first; the box-only scorer never does."""
    text = "Answer: 42\n\\boxed{7}"
    assert dapo_score(text, "42")["acc"] is True and boxed_score(text, "42")["acc"] is False


HUGE = {
    "filler then box": lambda: "x" * 10**6 + BOX,
    "box then filler": lambda: BOX + "x" * 10**6,
    "brace flood": lambda: "\\boxed{" + "{" * 10**6,
    "box flood": lambda: "\\boxed{" * 10**5 + "42" + "}" * 10**5,
    "dollar flood": lambda: "\\boxed{" + "$" * 250 + "}" + "$ " * 10**5,
    "many boxes": lambda: "\\boxed{1}" * 10**5 + BOX,
}


@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_inputs_stay_fast(name):
    text = HUGE[name]()
    t0 = time.perf_counter()
    for _ in range(20):
        out = boxed_score(text, "42")
    per_call = (time.perf_counter() - t0) / 20
    assert out["acc"] is (name in ("filler then box", "many boxes"))
    assert per_call < 0.05, f"{name}: {per_call * 1e3:.1f} ms a call"  # reads 300 characters at most


# --- against the published verifier ---------------------------------------------------------------

ANSWERS = ["42", "\\frac{1}{2}", "\\frac12", "1,000", "1000", "30^\\circ", "30", "\\sqrt{2}", "\\sqrt2",
           "5\\text{ cm}", "5", "x = 7", "7", "(1,2)", "-7", "\\$12", "12", "{,}3", "\\text{B}", "B"]
WORDS = ["so", "then", "\\boxed{", "}", "{", "Answer:", "$", "=", "\n", "the", "x", "2", "\\frac{1}{2}"]


def _cases(rng: random.Random) -> list[dict]:
    cases = []
    for _ in range(300):
        given, truth, other = rng.choice(ANSWERS), rng.choice(ANSWERS), rng.choice(ANSWERS)
        pre = " ".join(rng.choice(WORDS) for _ in range(rng.choice([0, 5, 80])))
        post = "." * rng.choice([0, 3, 150, 280, 290, 299, 320])
        form = rng.randrange(6)
        text = [f"{pre} \\boxed{{{given}}}{post}",
                f"{pre} \\boxed{{{other}}} and \\boxed{{{given}}}{post}",
                f"{pre} \\boxed{{{given}}} and \\boxed{{{other}}}",
                f"{pre}\nAnswer: {given}\n{post}",
                f"{pre} \\boxed{{{given}",
                f"Answer: {other}\n{pre} $\\boxed{{{given}}}$"][form]
        cases.append({"solution_str": text, "ground_truth": truth})
    return cases


def test_boxed_score_is_the_published_verifier(verl_python):
    cases = _cases(random.Random(torch.initial_seed()))
    theirs = verl_env.verl_box_verdicts(verl_python, cases)
    mismatches = []
    for case, ref in zip(cases, theirs):
        ours = boxed_score(case["solution_str"], case["ground_truth"])
        # the two documented departures: no box, or an empty answer, is never right
        want = ref["acc"] and ref["boxed"] and ref["pred"] != ""
        if ours["acc"] is not want or (ref["boxed"] and ours["pred"] != ref["pred"]):
            mismatches.append((case, ours, ref))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ, e.g. {mismatches[:3]}"
    # the cases reach both verdicts and both sides of the 300-character cut
    assert {r["acc"] for r in theirs} == {True, False}
    assert any(not r["boxed"] for r in theirs) and sum(r["boxed"] for r in theirs) > 100
