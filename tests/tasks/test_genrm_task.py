"""The embedded GenRM task (data.task=genrm): its records, its demonstrations, its budgets, and
GenRM records read from a verl-style parquet file."""

import collections
import random

import pytest

from reasonrl_fast.tasks.addition import flawed_step
from reasonrl_fast.config import DataConfig
from reasonrl_fast.tasks import genrm_request
from reasonrl_fast.tasks.genrm import (SOURCE, class_accuracy, demonstration, genrm_split, judgment, prompt_budget, verdict_budget,
                                       verdict_demo)
from reasonrl_fast.data.records import check_ground_truth, load_records
from reasonrl_fast.protocol import render
from reasonrl_fast.tasks.addition import judge_addition
from reasonrl_fast.rewards.score import default_compute_score


def test_a_hand_built_judgment():
    # 47 + 85: the first column's sum miswritten (22 for 12) while the answer stays right
    rec = judgment(47, 85, 2, "7+5=22,4+8+1=13 \\boxed{132}")
    assert rec["prompt"] == "47+85=132|7+5=22|4+8+1=13|"
    assert (rec["answer"], rec["data_source"], rec["ability"]) == ("0", SOURCE, "genrm")
    assert rec["extra_info"] == {"problem": "47+85=", "answer": "132", "steps": ["7+5=22", "4+8+1=13"]}
    assert judgment(47, 85, 2, "7+5=12,4+8=12 \\boxed{122}")["answer"] == "1"  # forgot the carry
    assert judgment(47, 85, 2, "7+5=12,4+8+1=13 \\boxed{132}")["answer"] == "-1"


@pytest.mark.parametrize("digits", [2, 3])
def test_split_is_balanced_and_consistent(digits):
    recs = genrm_split(600, digits, seed=5)
    counts = collections.Counter(r["answer"] for r in recs)
    assert 0.42 < counts["-1"] / len(recs) < 0.58, counts
    assert len(counts) == digits + 1  # every step index occurs, and -1
    for r in recs[:200]:
        x = r["extra_info"]
        # the prompt is what FAPO's client renders about this solution on the embedded task
        item = {"prompt": x["problem"], "answer": x["answer"], "data_source": "addition"}
        assert genrm_request(item, ",".join(x["steps"]) + " \\boxed{0}") == (x["problem"], x["answer"], x["steps"])
        assert r["prompt"] == render("compact", x["problem"], x["answer"], x["steps"])
        # the truth is the step checker's, and the rule judge reading the prompt agrees
        assert int(r["answer"]) == flawed_step(x["problem"], ",".join(x["steps"]))
        assert judge_addition(r["prompt"])[1] == int(r["answer"])
        assert check_ground_truth(r["answer"], "genrm", x, "row") == r["answer"]
        assert len(r["prompt"]) <= prompt_budget(digits)
    # the bound is reached but for the first column, which never has an incoming "+1"
    assert max(len(r["prompt"]) for r in recs) == prompt_budget(digits) - 2
    assert genrm_split(50, digits, seed=5) == recs[:50]  # seeded


def test_demonstrations_are_right_verdicts_within_budget():
    rng, longest = random.Random(0), 0
    for _ in range(300):
        prompt, demo = demonstration(rng, DataConfig(digits=3, carry_frac=0.75, carry_slip_prob=0.5, flaw_prob=0.4))
        steps = prompt.split("|")[1:-1]
        truth = judge_addition(prompt)[1]
        assert len(demo) + 1 <= verdict_budget(3)
        longest = max(longest, len(demo) + 1)
        assert default_compute_score(SOURCE, demo, str(truth), {"steps": steps}) == {"score": 1.0, "acc": True}
    assert longest == verdict_budget(3)  # the bound is reached
    assert verdict_demo(3, -1) == "ok,ok,ok \\boxed{-1}" and verdict_demo(3, 1) == "ok,bad \\boxed{1}"


def test_impossible_mix_is_a_clear_error():
    with pytest.raises(ValueError, match="data.carry_slip_prob"):
        genrm_split(20, 2, seed=0, slip_prob=0.0, flaw_prob=0.0)


def test_verl_parquet_with_genrm_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, r in enumerate(genrm_split(3, 2, seed=9)):
        rows.append({"data_source": "genrm", "prompt": [{"role": "user", "content": r["prompt"]}],
                     "ability": "genrm", "reward_model": {"style": "rule", "ground_truth": r["answer"]},
                     "extra_info": {**r["extra_info"], "split": "train", "index": i}})
    path = str(tmp_path / "genrm.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    recs = load_records(path)
    assert [r["answer"] for r in recs] == [r["reward_model"]["ground_truth"] for r in rows]
    for rec, row in zip(recs, rows):
        assert rec["ability"] == "genrm" and rec["extra_info"]["steps"] == row["extra_info"]["steps"]
        truth = int(rec["answer"])
        right = default_compute_score(rec["data_source"], f"\\boxed{{{truth}}}", rec["answer"], rec["extra_info"])
        assert right == {"score": 1.0, "acc": True}
    # a row whose steps are missing names the file, the row and the key
    rows[1]["extra_info"] = {"problem": "1+1=", "answer": "2", "split": "train", "index": 1}
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"genrm\.parquet:2: `extra_info` of a genrm record lacks \['steps'\]"):
        load_records(path)


def test_class_accuracy_is_faposs_flawed_or_clean_agreement_beside_the_exact_index():
    """val/class_accuracy counts a verdict right when it says flawed or clean as the truth does
    (the published `acc`); the step index need not match, and an unreadable or out-of-range
    verdict counts wrong. Records that are not GenRM's are left out."""
    steps = {"problem": "p", "answer": "4", "steps": ["a", "b", "c"]}
    rec = lambda truth: {"ability": "genrm", "answer": str(truth), "extra_info": steps}  # noqa: E731
    items = [rec(-1), rec(-1), rec(1), rec(1), rec(2), rec(0), {"ability": "math", "answer": "4"}]
    texts = [r"\boxed{-1}", r"\boxed{0}", r"\boxed{2}", r"\boxed{1}", "no verdict", r"\boxed{7}", r"\boxed{-1}"]
    acc = [True, False, False, True, False, False, True]
    out = class_accuracy(items, texts, acc)
    assert out == {"val/accuracy_no_error": 0.5, "val/accuracy_flawed": 0.25, "val/class_accuracy": 3 / 6}
    assert class_accuracy(items[-1:], texts[-1:], acc[-1:]) == {}
