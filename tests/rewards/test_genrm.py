"""The GenRM training reward (docs/math.md §FAPO rewards), with hand-computed cases, and its
routing by data_source."""

import pytest

from reasonrl_fast.rewards.genrm import genrm_reward, genrm_score
from reasonrl_fast.rewards.score import default_compute_score, scorer_for

FOUR = {"problem": "47+85=", "answer": "132", "steps": ["7+5=12", "4+8+1=13", "x", "y"]}


@pytest.mark.parametrize("text,truth,score,acc", [
    (r"\boxed{2}", "2", 1.0, True),              # exact index
    (r"the third \boxed{0}", "2", 0.5, False),   # both flawed: 1 - |0 - 2| / 4
    (r"\boxed{3}", 2, 0.75, False),              # 1 - 1/4; an int ground truth works too
    (r"\boxed{-1}", "-1", 1.0, True),            # right "no error"
    (r"\boxed{1}", "-1", -1.0, False),           # flags a flawless solution
    (r"\boxed{-1}", "0", -1.0, False),           # misses the flaw
    ("no box at all", "-1", -1.0, False),        # unreadable
    (r"\boxed{4}", "2", -1.0, False),            # past the last of 4 steps: unreadable
    (r"\boxed{1.5}", "1", -1.0, False),
    (r"\boxed{1} then \boxed{2}", "2", 1.0, True),  # the last box counts
])
def test_hand_computed(text, truth, score, acc):
    assert genrm_score(text, truth, FOUR) == {"score": score, "acc": acc}


def test_n_steps_comes_from_extra_info():
    three = {**FOUR, "steps": FOUR["steps"][:3]}
    five = {**FOUR, "steps": FOUR["steps"] + ["z"]}
    assert genrm_score(r"\boxed{3}", "1", three)["score"] == -1.0  # no step 3 among three
    assert genrm_score(r"\boxed{3}", "1", FOUR)["score"] == pytest.approx(0.5)
    assert genrm_score(r"\boxed{3}", "1", five)["score"] == pytest.approx(0.6)
    assert genrm_reward(None, 1, 5) == -1.0


@pytest.mark.parametrize("extra", [None, {}, {"problem": "1+1=", "answer": "2"}])
def test_missing_steps_names_the_key(extra):
    with pytest.raises(ValueError, match=r"extra_info\.steps"):
        genrm_score(r"\boxed{-1}", "-1", extra)


def test_bad_ground_truth_is_a_clear_error():
    with pytest.raises(ValueError, match="ground truth"):
        genrm_score(r"\boxed{0}", "first", FOUR)
    with pytest.raises(ValueError, match=r"outside \[-1, 4\)"):
        genrm_score(r"\boxed{0}", "4", FOUR)


@pytest.mark.parametrize("source", ["genrm", "GenRM_addition", "genrm_math"])
def test_routing(source):
    assert scorer_for(source) == "genrm"
    # the math scorer would call 1 != 0 wrong with 0 reward; the GenRM reward gives partial credit
    assert default_compute_score(source, r"\boxed{1}", "0", FOUR) == {"score": 0.75, "acc": False}


@pytest.mark.proc
def test_through_the_pool():
    from reasonrl_fast.rewards.pool import RewardPool

    samples = [("genrm", r"\boxed{-1}", "-1", FOUR), ("genrm", r"\boxed{3}", "1", FOUR),
               ("genrm", "???", "1", FOUR), ("math", r"\boxed{2}", "2", None)]
    with RewardPool("", num_workers=1, timeout_s=30) as pool:
        results, m = pool.score(samples)
    assert m["reward/errors"] == 0
    assert [r["score"] for r in results] == [1.0, 0.5, -1.0, 1.0]
    assert [r["acc"] for r in results] == [True, False, False, True]
