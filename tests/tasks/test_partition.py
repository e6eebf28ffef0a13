"""The partition task (data.task=partition): its scorer against right, wrong and hostile answers,
its held-out split, and its warm start's uneven styles and slips."""

import json
import random
from collections import Counter

import pytest

from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.eval.metrics import answer_key
from reasonrl_fast.rewards.score import default_compute_score, scorer_for
from reasonrl_fast.tasks import get_task, task_of
from reasonrl_fast.tasks.partition import budgets, demonstration, numbers, parse_truth, partition_score, work

T57 = json.dumps({"target": 57, "parts": 2})


@pytest.mark.parametrize("answer", ["23+34", "34+23", "47+10", "39+18", " 1 + 56 ", "56+1"])
def test_every_pair_of_positive_numbers_with_the_sum_is_right(answer):
    r = partition_score(f"work \\boxed{{{answer}}}", T57)
    assert r == {"score": 1.0, "acc": True}
    assert default_compute_score("partition", f"\\boxed{{{answer}}}", T57) == r


@pytest.mark.parametrize("response", [
    "\\boxed{57}",                          # a bare number
    "\\boxed{20+30+7}",                     # three parts where two are asked
    "\\boxed{57+0}", "\\boxed{0+57}",       # a zero part
    "\\boxed{023+34}", "\\boxed{23+034}",   # leading zeros
    "\\boxed{60-3}", "\\boxed{-3+60}", "\\boxed{60+-3}",  # signs
    "\\boxed{23*1+34}", "\\boxed{(23)+34}", "\\boxed{23+34=57}", "\\boxed{2.3e1+34}",
    "\\boxed{２3+34}", "\\boxed{23+3٤}",     # digits of other scripts
    "\\boxed{23\t+34}", "\\boxed{23+34\n}",  # other white space
    "\\boxed{23+35}",                       # the sum is wrong
    "23+34", "\\boxed{}", "\\boxed{23+34", "",  # no (closed) box
    "\\boxed{23+34} \\boxed{50+50}",        # the last box counts
    "\\boxed{" + "1+" * 5000 + "1}",         # long
    "\\boxed{" + "9" * 40 + "+1}",           # a part longer than any target
])
def test_hostile_answers_score_zero(response):
    assert partition_score(response, T57) == {"score": 0.0, "acc": False}


def test_the_last_box_counts_and_bad_truths_are_named():
    assert partition_score("\\boxed{50+50} then \\boxed{23+34}", T57)["acc"]
    for bad in ["57", '{"target": 1, "parts": 2}', '{"target": 57}', '{"target": 57.0, "parts": 2}',
                '{"target": true, "parts": 1}', "not json", '{"target": 57, "parts": 0}']:
        with pytest.raises(ValueError, match="partition ground truth"):
            parse_truth(bad)
    # the task names its own scorer; rewards/score.py names neither the source nor the scorer
    assert scorer_for("partition") == get_task("partition").scorer == "reasonrl_fast.tasks.partition:partition_score"
    assert scorer_for("Partition") == scorer_for("partition") and scorer_for("partition_x") == "math"
    assert answer_key("x \\boxed{ 23 + 34 }") == "23+34"


def test_the_held_out_numbers_never_reach_training_or_the_warm_start():
    train, val = set(numbers(2, "train")), set(numbers(2, "val"))
    assert not train & val and train | val == set(range(20, 100)) and len(val) == 16
    cfg = load_config(None, ["data.task=partition"])
    task = get_task("partition")
    recs = task.split(cfg.data, 200, 3, "val")
    assert {json.loads(r["answer"])["target"] for r in recs} <= val
    assert task.split(cfg.data, 200, 3, "val") == recs and task_of(recs[0]) is task
    rng = random.Random(0)
    assert all(int(demonstration(rng, cfg.data)[0].split()[1][:-1]) in train for _ in range(2000))


def test_the_warm_start_is_uneven_and_noisy():
    cfg = load_config(None, ["data.task=partition"])
    rng = random.Random(0)
    right, answers = 0, Counter()
    for _ in range(4000):
        prompt, response = demonstration(rng, cfg.data)
        n = int(prompt.split()[1][:-1])
        ok = partition_score(response, json.dumps({"target": n, "parts": 2}))["acc"]
        right += ok
        if ok and n == 57:
            answers[answer_key(response)] += 1
    assert 0.55 < right / 4000 < 0.75  # slips leave room for RL
    top = answers.most_common()
    assert top[0][0] == "23+34" and top[0][1] > 2 * top[1][1] and len(top) >= 3  # one style leads
    assert work([(2, 3), (3, 4)]) == "5:2+3,7:3+4 \\boxed{23+34}"


def test_the_task_checks_its_budgets():
    assert budgets(2) == (9, 26) and budgets(3) == (10, 34)
    load_config(None, ["data.task=partition"])
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=32: data.task=partition with data.digits=3 needs >= 34"):
        load_config(None, ["data.task=partition", "data.digits=3"])
    with pytest.raises(ConfigError, match="data.max_prompt_length=8"):
        load_config(None, ["data.task=partition", "data.max_prompt_length=8"])


def test_the_styles_mix_shapes_the_warm_start_and_its_cache_key():
    narrow = load_config(None, ["data.task=partition"])
    flat = load_config(None, ["data.task=partition", "data.partition.styles=[1,1,1]"])
    task = get_task("partition")
    # the default mix keeps the key the warm starts were cached under before it was a setting
    assert task.sft_key(narrow.data) == ("partition", 2, (("halves", 0.6), ("tens", 0.3), ("any", 0.1)), 0.35)
    assert task.sft_key(flat.data) != task.sft_key(narrow.data)

    def top_share(cfg):
        rng, answers = random.Random(1), Counter()
        while sum(answers.values()) < 1500:
            prompt, response = demonstration(rng, cfg.data)
            if prompt == "split 57:" and partition_score(response, json.dumps({"target": 57, "parts": 2}))["acc"]:
                answers[answer_key(response)] += 1
        return answers.most_common(1)[0][1] / 1500, len(answers)

    (share_n, kinds_n), (share_f, kinds_f) = top_share(narrow), top_share(flat)
    # halves: 0.6 + a tenth of "any" landing there, against a third + a fraction
    assert 0.55 < share_n < 0.70 and 0.30 < share_f < 0.45 and kinds_f >= kinds_n
    for bad in ("[1,1]", "[1,-1,1]", "[0,0,0]"):
        with pytest.raises(ConfigError, match=r"data.partition.styles=.*needs 3 weights \(halves, tens, any\)"):
            load_config(None, ["data.task=partition", f"data.partition.styles={bad}"])
