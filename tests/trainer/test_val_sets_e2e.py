"""Validation as the papers report it, in a real run of the embedded model: two sets of
data.val_sets with different samples per prompt each log their own metrics, val/accuracy is
their macro average, and the eval command, given the run's config.yaml and its checkpoint,
reports the same numbers with the seeds of that step (docs/trainer.md §Validation, docs/eval.md
§Validation sets)."""

import json
import subprocess
import sys

import pytest
from tests.helpers.train import ROOT, read_metrics, repo_env, sft_cache

# the shared run's model and warm start (tests/helpers/train.py SHARED: accuracy far from 0 and 1)
WARM = ["model.hidden_size=64", "model.intermediate_size=128", "sft.steps=600", "sft.batch_size=32",
        "rollout.max_new_tokens=32"]
SETS = "[{name: once, n: 1}, {name: four, n: 4, k: [1, 2, 4], maj: true, temperature: 1.0}]"


def test_two_validation_sets_log_one_metric_each_and_their_macro_average_and_eval_agrees(train, tmp_path):
    out = tmp_path / "run"
    train([*WARM, "trainer.steps=2", "trainer.val_every=2", "trainer.save_every=2", "data.val_size=24",
           f"data.val_sets={SETS}", f"trainer.output_dir={out}"], tmp_path, timeout=300)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in (rows[0], rows[2]):
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

    # the eval command on checkpoint-2 with the run's own config and step 2's seeds: the same numbers
    ev = tmp_path / "eval"
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.eval", str(out / "config.yaml"),
                        f"model.path={out / 'checkpoint-2'}", "eval.val_sets=true", "eval.val_step=2",
                        f"eval.output_dir={ev}", f"sft.cache_dir={sft_cache(tmp_path)}"],
                       cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads((ev / "summary.json").read_text())
    logged = rows[2]
    for name, keys in (("once", ["mean@1"]), ("four", ["mean@4", "pass@1", "pass@2", "pass@4", "maj@4"])):
        got = summary["sets"][name]["overall_micro"]
        assert {k: got[k] for k in keys} == {k: logged[f"val/{name}/{k}"] for k in keys}, (name, got)
    assert summary["val/accuracy"] == logged["val/accuracy"]
    samples = [json.loads(x) for x in (ev / "samples.jsonl").read_text().splitlines()]
    assert [s["set"] for s in samples] == ["once"] * 24 + ["four"] * 96
