"""The reward stage inside real runs: the built-in code task scored in the sandbox through
Ray-backed reward workers (FlowRL), and a reward function that never returns."""

import os

from tests.helpers.train import read_metrics


def test_flowrl_on_the_code_task_with_ray_reward_workers(train, tmp_path):
    out = tmp_path / "run"
    train(["algo=flowrl", "data.task=code", "trainer.steps=3", f"trainer.output_dir={out}",
               "data.max_prompt_length=64", "rollout.max_new_tokens=24", "data.val_size=4",
               "trainer.val_every=3", "reward.backend=ray", "reward.num_workers=2"], tmp_path)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert r["reward/errors"] == 0 and r["reward/timeouts"] == 0
        # each response ran in a sandbox (tens of ms); a math answer scores in microseconds
        assert r["reward/latency_p50_s"] > 0.01, r
        assert "tb/delta_abs_mean" in r
    assert "val/accuracy" in rows[0] and "val/accuracy" in rows[-1]


def test_a_reward_that_never_returns_is_cut_off(train, tmp_path):
    out = tmp_path / "run"
    flag = tmp_path / "hung-once"
    train(["algo=grpo", "trainer.steps=2", f"trainer.output_dir={out}", "trainer.val_every=0",
               "data.reward_fn=tests.helpers.faulty_rewards:sleeps_forever_once", "reward.timeout_s=3",
               "reward.sandbox_timeout_s=1"], tmp_path, env_extra={"REASONRL_HANG_FLAG": str(flag)})
    rows = read_metrics(out)
    assert os.path.exists(flag)  # the hang happened
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["reward/timeouts"] for r in rows] == [1, 0]
    assert rows[0]["reward/latency_p99_s"] >= 3.0
    assert rows[0]["time/reward_s"] < 3.0 + 10.0, rows[0]["time/reward_s"]
