"""A new embedded task is one module and one registry line: registered from outside the package
(tests/tasks/plugin_task.py), it is a `data.task` choice, its records are made and routed to its
own scorer, in this process and in the reward pool's worker processes, with no edit to
rewards/score.py."""

import json

import pytest

from reasonrl_fast.config import load_config
from reasonrl_fast.rewards.score import default_compute_score, scorer_for
from reasonrl_fast.runtime.datasets import embedded_split
from reasonrl_fast.tasks import TASKS, get_task, task_of
from tests.tasks import plugin_task


@pytest.fixture
def reverse(monkeypatch):
    monkeypatch.setitem(TASKS, "reverse", plugin_task.PATH)  # the one registry line
    return get_task("reverse")


def test_a_registered_task_is_a_choice_and_routes_to_its_scorer(reverse):
    cfg = load_config(None, ["data.task=reverse"])
    records = embedded_split(cfg.data, 4, 7)
    assert [r["data_source"] for r in records] == ["reverse"] * 4 and task_of(records[0]) is reverse
    right, wrong = f"\\boxed{{{records[0]['answer']}}}", "\\boxed{x}"
    assert scorer_for("reverse") == plugin_task.Reverse.scorer
    assert default_compute_score("reverse", right, records[0]["answer"]) == {"score": 2.0, "acc": True}
    assert default_compute_score("reverse", wrong, records[0]["answer"]) == {"score": -0.5, "acc": False}


def test_an_unregistered_task_is_not_a_choice():
    with pytest.raises(ValueError, match="data.task='reverse': must be one of"):
        load_config(None, ["data.task=reverse"])
    assert scorer_for("reverse") == "math"


@pytest.mark.proc
def test_the_reward_pools_workers_route_embedded_records_to_their_tasks_scorers(reverse):
    from reasonrl_fast.rewards.pool import RewardPool

    t57 = json.dumps({"target": 57, "parts": 2})
    samples = [("reverse", "\\boxed{cba}", "cba", None), ("reverse", "\\boxed{abc}", "cba", None),
               ("partition", "\\boxed{39+18}", t57, None), ("partition", "\\boxed{57}", t57, None),
               ("math", "\\boxed{5}", "5", None), ("addition", "\\boxed{12}", "13", None)]
    with RewardPool("", num_workers=1, timeout_s=60) as pool:
        results, metrics = pool.score(samples)
    assert (metrics["reward/errors"], metrics["reward/timeouts"]) == (0, 0), pool.last_error
    assert [(r["score"], r["acc"]) for r in results] == [
        (2.0, True), (-0.5, False), (1.0, True), (0.0, False), (1.0, True), (0.0, False)]
