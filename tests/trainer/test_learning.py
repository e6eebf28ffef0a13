"""The full learning check of the embedded default (the `slow` tier: `make test-slow`, ~3-5 min each):
the whole run, supervised warm start included, finishes within 10 minutes on the 2-core machine
and raises validation accuracy by at least 20 points over the warm start. The flawed positives:
GRPO rewards them and ends with at least 10 % of its right answers flawed; FAPO ends with at
most 5 %, so at most half of GRPO's."""

import subprocess
import sys
import time

import pytest

from tests.helpers.train import ROOT, read_metrics, repo_env, sft_cache

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algo", ["flowrl", "grpo", "fapo"])
def test_default_run_learns(algo, tmp_path):
    out = tmp_path / algo
    env = repo_env()
    t0 = time.time()
    # a fresh SFT cache, so the measured time includes the warm start
    subprocess.run([sys.executable, "-m", "reasonrl_fast.train", f"algo={algo}", f"trainer.output_dir={out}",
                    f"sft.cache_dir={tmp_path / 'sft'}", "trainer.progress=false"],
                   cwd=ROOT, env=env, check=True, timeout=900)
    wall = time.time() - t0
    rows = [r for r in read_metrics(out) if "val/accuracy" in r]
    vals = [r["val/accuracy"] for r in rows]
    flawed = [r["val/flawed_positive_ratio"] for r in rows]
    print(f"{algo}: warm start {vals[0]:.3f} -> final {vals[-1]:.3f} in {wall:.0f}s; "
          f"flawed positives {flawed[0]:.3f} -> {flawed[-1]:.3f}")
    assert wall < 600
    assert vals[-1] - vals[0] >= 0.20
    if algo == "grpo":
        assert flawed[-1] >= 0.10
    if algo == "fapo":
        assert flawed[-1] <= 0.05


def test_default_run_learns_with_its_rows_cut_over_both_workers(tmp_path):
    """The embedded default (FlowRL) with trainer.sequence_parallel_size=2: its two workers train
    as one data-parallel group, each on half of every packed row (Ulysses attention, log Z pooled
    across the halves), and validation still rises 20 points over the warm start."""
    out = tmp_path / "sp2"
    subprocess.run([sys.executable, "-m", "reasonrl_fast.train", "trainer.sequence_parallel_size=2",
                    f"trainer.output_dir={out}", f"sft.cache_dir={sft_cache(tmp_path)}", "trainer.progress=false"],
                   cwd=ROOT, env=repo_env(), check=True, timeout=900)
    vals = [r["val/accuracy"] for r in read_metrics(out) if "val/accuracy" in r]
    print(f"sequence parallel 2: warm start {vals[0]:.3f} -> final {vals[-1]:.3f}")
    assert vals[-1] - vals[0] >= 0.20, vals


# The policy losses (grpo.policy_loss) on GRPO: GSPO at its paper's clip range and aggregation,
# CISPO at GRPO's clip. The embedded default updates once per step (one mini-batch), so each
# ratio is 1 and no clip binds: this checks that each loss's gradient teaches, as GRPO's does.
POLICY_LOSSES = {"gspo": ["grpo.loss_agg=seq-mean-token-mean", "grpo.clip_low=3e-4", "grpo.clip_high=4e-4"],
                 "cispo": []}


@pytest.mark.parametrize("policy", POLICY_LOSSES)
def test_each_policy_loss_learns(policy, tmp_path):
    out = tmp_path / policy
    subprocess.run([sys.executable, "-m", "reasonrl_fast.train", "algo=grpo", f"grpo.policy_loss={policy}",
                    *POLICY_LOSSES[policy], f"trainer.output_dir={out}", f"sft.cache_dir={sft_cache(tmp_path)}",
                    "trainer.progress=false"], cwd=ROOT, env=repo_env(), check=True, timeout=900)
    vals = [r["val/accuracy"] for r in read_metrics(out) if "val/accuracy" in r]
    print(f"{policy}: warm start {vals[0]:.3f} -> final {vals[-1]:.3f}")
    assert vals[-1] - vals[0] >= 0.20, vals


def test_the_entropy_bonus_keeps_the_entropy_up_and_still_learns(tmp_path):
    """GRPO with grpo.entropy_coef=0.05 beside the same run without it (same seed, so step 1 is
    the same): the policy's entropy stays above the coef-0 run's at most steps and on average,
    and validation still rises 20 points. Measured (RESULTS §6): 137 of 150 steps above; at 0.2
    the entropy grew until the policy fell apart."""
    def run(coef: float) -> list[dict]:
        out = tmp_path / f"coef{coef}"
        subprocess.run([sys.executable, "-m", "reasonrl_fast.train", "algo=grpo", f"grpo.entropy_coef={coef}",
                        f"trainer.output_dir={out}", f"sft.cache_dir={sft_cache(tmp_path)}", "trainer.progress=false"],
                       cwd=ROOT, env=repo_env(), check=True, timeout=900)
        return read_metrics(out)

    off, on = run(0.0), run(0.05)
    h_off, h_on = ([r["entropy/mean"] for r in rows if "entropy/mean" in r] for rows in (off, on))
    above = sum(a > b for a, b in zip(h_on[1:], h_off[1:])) / (len(h_on) - 1)
    vals = [r["val/accuracy"] for r in on if "val/accuracy" in r]
    print(f"entropy_coef 0.05: mean entropy {sum(h_on) / len(h_on):.4f} against {sum(h_off) / len(h_off):.4f}, "
          f"above at {above:.0%} of steps; validation {vals[0]:.3f} -> {vals[-1]:.3f}")
    assert above >= 0.75 and sum(h_on) > sum(h_off), (h_on, h_off)
    assert vals[-1] - vals[0] >= 0.20, vals
