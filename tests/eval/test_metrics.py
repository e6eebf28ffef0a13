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


# ------------------------------------------------------------------ distance to a target


def _tables(rng):
    """Two random count tables over awkward overlapping supports."""
    keys = [f"{a}+{57 - a}" for a in range(1, 57)]
    p = {k: rng.randint(1, 9) for k in rng.sample(keys, rng.randint(1, 11))}
    q = {k: rng.randint(1, 9) for k in rng.sample(keys, rng.randint(1, 11))}
    return p, q


def test_tv_and_kl_match_exact_fractions_on_random_tables():
    from reasonrl_fast.eval.metrics import kl_divergence, tv_distance

    rng = random.Random()
    for _ in range(200):
        p, q = _tables(rng)
        keys = p.keys() | q.keys()
        P, Q = sum(p.values()), sum(q.values())
        tv = sum(abs(Fraction(p.get(k, 0), P) - Fraction(q.get(k, 0), Q)) for k in keys) / 2
        assert tv_distance(p, q) == pytest.approx(float(tv), abs=1e-12)
        assert tv_distance(p, q) == pytest.approx(tv_distance(q, p), abs=1e-15)
        a = Fraction(1, 2)
        ps = {k: (p.get(k, 0) + a) / (P + a * len(keys)) for k in keys}
        qs = {k: (q.get(k, 0) + a) / (Q + a * len(keys)) for k in keys}
        kl = sum(float(ps[k]) * math.log(float(ps[k] / qs[k])) for k in keys)
        assert kl_divergence(p, q) == pytest.approx(kl, rel=1e-12, abs=1e-15)


def test_tv_and_kl_hand_cases():
    from reasonrl_fast.eval.metrics import kl_divergence, tv_distance

    assert tv_distance({"a": 3}, {"a": 7}) == 0 and kl_divergence({"a": 3}, {"a": 7}) == 0
    assert tv_distance({"a": 2}, {"b": 5}) == 1  # disjoint answers
    assert tv_distance({"a": 1, "b": 1}, {"a": 3, "b": 1}) == pytest.approx(0.25)
    # disjoint with half a count either side: (2.5/3, .5/3) against (.5/6, 5.5/6)
    p, q = [2.5 / 3, 0.5 / 3], [0.5 / 6, 5.5 / 6]
    assert kl_divergence({"a": 2}, {"b": 5}) == pytest.approx(sum(x * math.log(x / y) for x, y in zip(p, q)))
    # smoothing pulls a few counts together; with many it nears the plain KL of the proportions
    true = math.log(2) / 3  # KL((2/3, 1/3) || (1/3, 2/3))
    small, large = kl_divergence({"a": 2, "b": 1}, {"a": 1, "b": 2}), kl_divergence({"a": 2000, "b": 1000}, {"a": 1000, "b": 2000})
    assert 0 < small < large < true and large == pytest.approx(true, rel=1e-3)
    for bad in (({}, {"a": 1}), ({"a": 1}, {})):
        with pytest.raises(ValueError, match="at least one count"):
            tv_distance(*bad)
    with pytest.raises(ValueError, match="alpha > 0"):
        kl_divergence({}, {})


def test_summarize_reports_the_distance_to_a_target_where_both_sides_answered_right():
    n = 4
    rs = [PromptResult("partition", [True, True, False, True], [5] * n, None, ["a", "a", "x", "b"], {"a": 2, "b": 2}),
          PromptResult("partition", [True, True, True, True], [5] * n, None, ["a"] * 4, {"c": 3}),
          PromptResult("partition", [False] * n, [5] * n, None, ["a"] * 4, {"a": 1}),  # none right here
          PromptResult("partition", [True] * n, [5] * n, None, ["a"] * 4, {}),  # none right there
          PromptResult("other", [True] * n, [5] * n, None, ["z"] * 4, {"z": 4})]
    s = summarize(rs, n, [1])
    part = s["per_source"]["partition"]
    tv = [abs(2 / 3 - 1 / 2) / 2 + abs(1 / 3 - 1 / 2) / 2, 1.0]
    assert part["target_prompts"] == 2 and part["tv@4"] == pytest.approx(sum(tv) / 2)
    assert part["tv_se@4"] == pytest.approx(standard_error(tv))
    assert s["per_source"]["other"]["tv@4"] == 0 and s["per_source"]["other"]["tv_se@4"] == 0
    assert s["overall"]["target_prompts"] == 3 and s["overall_micro"]["target_prompts"] == 3
    assert s["overall"]["tv@4"] == pytest.approx(part["tv@4"] / 2)  # macro: the mean of the sources'
    assert s["overall"]["tv_se@4"] == pytest.approx(math.sqrt(part["tv_se@4"] ** 2) / 2)
    assert s["overall"]["kl@4"] > 0
    # without targets the keys are absent (summary.json stays as before)
    plain = summarize([PromptResult("partition", [True] * n, [5] * n, None, ["a"] * 4)], n, [1])
    assert not any(k.startswith(("tv", "kl", "target")) for k in plain["overall"])
