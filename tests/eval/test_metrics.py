"""The eval metrics against brute force and hand-worked cases (no model; well under a second)."""

import itertools
import math
import random
from fractions import Fraction

import pytest

from reasonrl_fast.eval.metrics import PromptResult, maj_at_n, mean_at_n, pass_at_k, standard_error, summarize
from reasonrl_fast.rewards.math import math_equal


def _brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
    items = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(items[i] for i in s) for s in subsets), len(subsets))


def test_pass_at_k_matches_enumeration():
    rng = random.Random()
    cases = {(n, c, k) for n in (1, 2, 5) for c in range(n + 1) for k in range(1, n + 1)}
    while len(cases) < 80:
        n = rng.randint(1, 12)
        cases.add((n, rng.randint(0, n), rng.randint(1, n)))
    for n, c, k in sorted(cases):
        assert pass_at_k(n, c, k) == pytest.approx(float(_brute_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


@pytest.mark.parametrize("c,k", [(1, 1), (1, 10), (3, 32), (10, 100), (500, 1), (990, 5), (0, 7), (1, 999)])
def test_pass_at_k_stable_at_n_1000(c, k):
    n = 1000
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    got = pass_at_k(n, c, k)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match=r"k=5.*n=4"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match=r"c=5.*n=4"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, -1, 1)


def test_mean_and_se():
    assert mean_at_n([True, False, False, True]) == 0.5
    assert mean_at_n([1.0, 0.0, 0.5]) == pytest.approx(0.5)
    assert standard_error([0.75]) == 0.0
    # per-prompt means 0, 0.5, 1: std (n-1) = 0.5, se = 0.5 / sqrt(3)
    assert standard_error([0.0, 0.5, 1.0]) == pytest.approx(0.5 / math.sqrt(3))
    with pytest.raises(ValueError):
        mean_at_n([])


def test_maj_ties_none_and_math_equality():
    eq = str.__eq__
    # 2 votes for "3" and 2 for "4": the tie goes to the group seen first
    assert maj_at_n(["3", "4", "4", "3"], "3", eq) is True
    assert maj_at_n(["4", "3", "3", "4"], "3", eq) is False
    # None does not vote: "7" wins 1-0 against nothing, although most responses have no answer
    assert maj_at_n([None, None, "7", None], "7", eq) is True
    assert maj_at_n([None, None], "7", eq) is False
    assert maj_at_n([], "7", eq) is False
    # "0.5" and "\frac{1}{2}" are one group (2 votes) and beat "2" (also seen first, 1 vote)
    assert maj_at_n(["2", "0.5", "\\frac{1}{2}"], "1/2", math_equal) is True
    assert maj_at_n(["2", "0.5", "\\frac{1}{3}"], "1/2", math_equal) is False  # 1-1-1: "2" first


def test_summarize_macro_vs_micro():
    # source a: 3 prompts, n=2: means 1, 0.5, 0 -> mean 0.5; source b: 1 prompt, mean 0 (code)
    res = [PromptResult("a", [True, True], [4, 6], True), PromptResult("a", [True, False], [2, 2], False),
           PromptResult("a", [False, False], [10, 10], False), PromptResult("b", [False, False], [1, 3], None)]
    s = summarize(res, 2, [1, 2])
    a, b = s["per_source"]["a"], s["per_source"]["b"]
    assert a["mean@2"] == pytest.approx(0.5) and b["mean@2"] == 0.0
    assert a["se@2"] == pytest.approx(0.5 / math.sqrt(3)) and b["se@2"] == 0.0
    assert a["pass@2"] == pytest.approx(2 / 3) and a["pass@1"] == pytest.approx(0.5)
    assert a["maj@2"] == pytest.approx(1 / 3) and b["maj@2"] is None
    assert a["response_length/mean"] == pytest.approx(34 / 6) and a["prompts"] == 3
    macro, micro = s["overall"], s["overall_micro"]
    assert macro["mean@2"] == pytest.approx(0.25)          # (0.5 + 0) / 2
    assert micro["mean@2"] == pytest.approx(1.5 / 4)       # (1 + 0.5 + 0 + 0) / 4
    assert macro["pass@2"] == pytest.approx(1 / 3) and micro["pass@2"] == pytest.approx(0.5)
    assert macro["maj@2"] == pytest.approx(1 / 3)          # b defines none
    assert micro["maj@2"] == pytest.approx(1 / 3)
    assert macro["se@2"] == pytest.approx(math.sqrt(a["se@2"] ** 2) / 2)
    assert micro["se@2"] == pytest.approx(standard_error([1, 0.5, 0, 0]))
    assert macro["prompts"] == micro["prompts"] == 4


def test_distinct_and_entropy_count_only_right_answers():
    from reasonrl_fast.eval.metrics import answer_key, distinct_right, right_entropy

    answers = ["9+4+1", "9+4+1", "5+5+4", None, "1+1+1", "9+4+1"]
    acc = [True, True, True, False, False, True]
    assert distinct_right(answers, acc) == 2
    assert right_entropy(answers, acc) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert right_entropy(["a", "a"], [True, True]) == 0.0 and distinct_right(["a"], [False]) == 0
    assert right_entropy(["a", "b"], [False, False]) is None
    assert right_entropy(list("abcd"), [True] * 4) == pytest.approx(math.log(4))
    assert answer_key("so \\boxed{ 1 + 2 }") == "1+2" and answer_key("no box") is None
    assert answer_key(" def f():\n  return 1 ", whole=True) == "deff():return1"


def test_summarize_reports_diversity_where_answers_are_given():
    rs = [PromptResult("partition", [True, True, False, True], [5] * 4, None, ["a", "b", "c", "a"]),
          PromptResult("partition", [False] * 4, [5] * 4, None, ["a", "b", None, None]),
          PromptResult("math", [True] * 4, [5] * 4, True)]
    out = summarize(rs, 4, [1, 4])
    part = out["per_source"]["partition"]
    assert part["distinct@4"] == 1.0  # (2 + 0) / 2 prompts
    h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert part["entropy@4"] == pytest.approx(h)  # the prompt without a right answer has none
    assert out["per_source"]["math"]["distinct@4"] is None and out["overall"]["distinct@4"] == 1.0


def test_validation_diversity_is_evals_summary():
    from reasonrl_fast.trainer.loop import diversity

    recs = [{"data_source": "partition"}, {"data_source": "partition"}]
    texts = ["\\boxed{1+2}", "\\boxed{2+1}", "\\boxed{1 + 2}", "x", "\\boxed{1+1}", "\\boxed{9}"]
    acc = [True, True, True, False, False, False]
    h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert diversity(recs, texts, acc, 3) == pytest.approx({"val/pass@3": 0.5, "val/distinct@3": 1.0,
                                                            "val/entropy@3": h})
    assert diversity(recs[:1], texts[3:], acc[3:], 3)["val/entropy@3"] == 0.0  # no right sample
