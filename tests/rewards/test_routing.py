"""Routing by data_source, through the pool, as the trainer's reward stage calls it: one batch
mixing math answers, the DAPO rule and programs (HumanEval style and stdin/stdout cases)."""

import json

import pytest

from reasonrl_fast.rewards.pool import RewardPool
from reasonrl_fast.rewards.score import as_result, default_compute_score, scorer_for, takes_two_args

HE_TRUTH = json.dumps({"test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"})
IO_TRUTH = json.dumps({"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]})
ADD = "def add(a, b):\n    return a + b\n"
IO_PROG = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


@pytest.mark.parametrize("source,kind", [
    ("math", "math"), ("addition", "math"), ("", "math"), ("HuggingFaceH4/MATH-500", "math"),
    ("math_dapo", "dapo"), ("aime24", "dapo"), ("AIME_2025", "dapo"),
    ("humaneval", "code"), ("livecodebench_v5", "code"), ("codecontests", "code"), ("code", "code"),
])
def test_scorer_for(source, kind):
    assert scorer_for(source) == kind


def score_responses(pool: RewardPool, items: list[dict], texts: list[str]):
    """The scoring half of the trainer's reward stage (scoring.rollout_and_score) on given responses,
    one per item: (rewards with non-finite ones as 0, acc flags, the reward/* counters)."""
    from reasonrl_fast.trainer.scoring import _samples, finite_rewards

    results, metrics = pool.score(_samples(items, texts))
    scores, nonfinite = finite_rewards([r["score"] for r in results])
    return scores, [r["acc"] for r in results], {**metrics, "reward/nonfinite": nonfinite}


@pytest.mark.proc
def test_a_mixed_batch_through_the_trainers_reward_stage():
    items = [
        {"data_source": "math", "answer": "0.5"},
        {"data_source": "math_dapo", "answer": "34"},
        {"data_source": "humaneval", "answer": HE_TRUTH},
        {"data_source": "codecontests", "answer": json.loads(IO_TRUTH)},  # a parsed object works too
        {"answer": "7"},  # no data_source: a math answer
    ]
    right = [r"so \boxed{\frac{1}{2}}", "Answer: 34", ADD, IO_PROG, r"\boxed{7}"]
    wrong = [r"\boxed{0.6}", "Answer: 35", "def add(a, b):\n    return a - b\n",
             "```python\nprint(5)\n```", r"\boxed{8}"]
    # the same answer under another source's scorer is not right: routing is by data_source
    crossed = [ADD, IO_PROG, r"\boxed{5}", r"\boxed{5}", IO_PROG]
    with RewardPool("", num_workers=2, timeout_s=30) as pool:
        scores, acc, m = score_responses(pool, items * 3, right + wrong + crossed)
    assert (m["reward/errors"], m["reward/timeouts"]) == (0, 0)
    n = len(items)
    assert scores[:n] == [1.0, 1.0, 1.0, 1.0, 1.0] and all(acc[:n])
    # DAPO: -1 for a wrong answer; stdin/stdout: one of two cases passes
    assert scores[n:2 * n] == [0.0, -1.0, 0.0, 0.5, 0.0] and not any(acc[n:2 * n])
    assert scores[2 * n:] == [0.0, -1.0, 0.0, 0.0, 0.0] and not any(acc[2 * n:])


def test_score_helpers():
    assert default_compute_score("aime24", r"\boxed{5}", "5") == {"score": 1.0, "acc": True}
    assert as_result(0.0) == {"score": 0.0, "acc": False}
    assert as_result(True) == {"score": 1.0, "acc": True}
    assert as_result({"score": -1, "acc": False, "pred": "3"}) == {"score": -1.0, "acc": False}
    assert as_result({"score": 0.5}) == {"score": 0.5, "acc": True}
    with pytest.raises(TypeError, match="float or a dict"):
        as_result("1.0x")
    with pytest.raises(ValueError, match="without 'score'"):
        as_result({"reward": 1})
    assert takes_two_args(lambda response, answer: 0)
    assert not takes_two_args(lambda data_source, solution_str, ground_truth, extra_info=None: 0)
    assert not takes_two_args(lambda solution_str, ground_truth: 0)  # names verl's signature
    assert not takes_two_args(lambda *args: 0)
