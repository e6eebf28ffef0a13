"""Validation as the papers report it, in a real run of the embedded model: two sets of
data.val_sets with different samples per prompt each log their own metrics, and val/accuracy
is their macro average (docs/trainer.md §Validation)."""

import pytest
from tests.helpers.train import read_metrics

# the shared run's model and warm start (tests/helpers/train.py SHARED: accuracy far from 0 and 1)
WARM = ["model.hidden_size=64", "model.intermediate_size=128", "sft.steps=600", "sft.batch_size=32",
        "rollout.max_new_tokens=32"]


def test_two_validation_sets_of_different_n_log_one_metric_each_and_their_macro_average(train, tmp_path):
    out = tmp_path / "run"
    sets = "[{name: once, n: 1}, {name: four, n: 4, k: [1, 2, 4], maj: true, temperature: 1.0}]"
    train([*WARM, "trainer.steps=1", "trainer.val_every=1", "data.val_size=24", f"data.val_sets={sets}",
           f"trainer.output_dir={out}"], tmp_path, timeout=300)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        once, four = r["val/once/mean@1"], r["val/four/mean@4"]
        assert 0 < once < 1 and 0 < four < 1, r
        assert r["val/accuracy"] == pytest.approx((once + four) / 2, abs=1e-12)
        # pass@1's unbiased estimate is the mean; pass@k grows with k
        assert r["val/four/pass@1"] == pytest.approx(four, abs=1e-12)
        assert four <= r["val/four/pass@2"] <= r["val/four/pass@4"] <= 1
        assert 0 <= r["val/four/maj@4"] <= 1
        assert "val/once/pass@1" not in r and "val/pass@4" not in r and "val/once/maj@1" not in r
        # a mean@1 over 24 prompts moves in steps of 1/24; a mean@4 in steps of 1/96
        assert round(once * 24, 9).is_integer() and round(four * 96, 9).is_integer()
