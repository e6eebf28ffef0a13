"""The example scripts themselves, end to end with the smallest settings that still run every
stage (one training step each), each stage reading what the last wrote:
examples/pipeline.sh (prepare -> train -> merge -> eval -> plot, on the embedded task and on a
verl-format parquet file) and examples/fapo_end_to_end.sh (the FAPO recipe with a learned GenRM).
What each stage does is checked in the e2e tests of its module; here, that the scripts chain
them."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.train import ROOT, repo_env, sft_cache

pytestmark = pytest.mark.e2e  # each script trains

TINY = ("model.hidden_size=32 model.intermediate_size=64 model.num_heads=2 sft.steps=5 sft.batch_size=8 "
        "data.prompts_per_step=4 optim.mini_batch_prompts=4 rollout.n=2 data.val_size=8")


def test_pipeline(tmp_path):
    out = tmp_path / "pipeline"
    env = repo_env(OUT=str(out), STEPS="1", EXTRA=f"{TINY} sft.cache_dir={sft_cache(tmp_path)}", PYTHON=sys.executable)
    p = subprocess.run(["bash", os.path.join(ROOT, "examples", "pipeline.sh")], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    addition = json.load(open(out / "eval-addition" / "summary.json"))
    smoke = json.load(open(out / "eval-smoke" / "summary.json"))
    assert addition["per_source"]["addition"]["prompts"] == 8 and "pass@4" in addition["overall"]
    assert smoke["per_source"]["smoke_math"]["prompts"] > 0 and "maj@2" in smoke["overall"]
    samples = [json.loads(x) for x in open(out / "eval-smoke" / "samples.jsonl")]
    assert len(samples) == 2 * smoke["per_source"]["smoke_math"]["prompts"]
    assert (out / "smoke-run" / "metrics.jsonl").exists() and (out / "addition-hf" / "config.json").exists()
    with open(out / "curves.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_fapo_end_to_end(tmp_path):
    """examples/fapo_end_to_end.sh with a few steps of each stage: GenRM training -> merge ->
    `genrm.serve --backend hf:` -> GRPO / FAPO rule / FAPO learned -> eval -> plot. Every policy
    response counts as right, so that the untrained policy still sends each of them to the
    learned judge."""
    out = tmp_path / "fapo"
    sft = f"sft.cache_dir={sft_cache(tmp_path)}"  # the warm starts this pytest run shares
    env = repo_env(OUT=str(out), STEPS="1", GENRM_STEPS="1", EXTRA=f"{sft} data.val_size=8", PYTHON=sys.executable,
               GENRM_EXTRA="sft.steps=40 data.prompts_per_step=4 optim.mini_batch_prompts=4 rollout.n=2",
               POLICY_EXTRA=f"{TINY} data.reward_fn=tests.helpers.faulty_rewards:always_right")
    p = subprocess.run(["bash", os.path.join(ROOT, "examples", "fapo_end_to_end.sh")], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    learned = [json.loads(x) for x in open(out / "fapo-learned" / "metrics.jsonl")][1:]
    assert [r["genrm/requests"] for r in learned] == [8]  # 4 prompts x 2 samples, all "right"
    health = json.load(open(out / "genrm-health.json"))  # the served model answered them
    assert health["completions"] >= 8 and health["generate_calls"] >= 1 and health["generate_errors"] == 0
    rule = [json.loads(x) for x in open(out / "fapo-rule" / "metrics.jsonl")][1:]
    assert all(r["genrm/checker_agreement"] == 1.0 == r["genrm/checker_step_agreement"] for r in rule)
    table = (out / "policies.md").read_text().splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| grpo (grpo)", "| fapo-rule (fapo)",
                                                          "| fapo-learned (fapo)"]
    assert "| genrm (grpo) |" in (out / "genrm.md").read_text()
    assert json.load(open(out / "eval-fapo-learned" / "summary.json"))["per_source"]["addition"]["prompts"] == 8
    with open(out / "policies.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
