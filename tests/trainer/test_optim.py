"""bf16 master weights and the learning rate: config.py refuses an lr that bf16 rounds away
(`check_bf16_lr`), unless optim.bf16_stochastic_round makes trainer/optim.py's `make_optimizer`
hand out torchao's AdamW, whose stochastic rounding moves a weight by its update in
expectation. The torchao cases run in child processes with torchao on their PYTHONPATH, a
cached folder beside the project's venv (tests/helpers/venvs.py says why not in it)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from reasonrl_fast.config import BF16_MIN_LR, ConfigError, load_config
from reasonrl_fast.trainer.optim import make_optimizer
from tests.helpers import venvs
from tests.helpers.procs import torchrun
from tests.helpers.train import ROOT

BF16 = ["model.dtype=bfloat16"]


# ---------------------------------------------------------------- the rule (config.py)


def test_bf16_at_a_recipe_lr_is_refused_naming_the_keys_and_the_fixes():
    with pytest.raises(ConfigError) as e:
        load_config(None, [*BF16, "optim.lr=1e-6"])
    line = str(e.value)
    assert "\n" not in line
    for said in ("model.dtype=bfloat16", "optim.lr=1e-06", f"{BF16_MIN_LR:.3g}", "model.dtype=float32",
                 "optim.bf16_stochastic_round=true"):
        assert said in line, (said, line)


@pytest.mark.parametrize("overrides", [
    [*BF16, "optim.lr=1e-4"],                  # a step bf16 resolves at |w| ~ 0.02
    [*BF16, f"optim.lr={BF16_MIN_LR}"],        # the threshold itself
    ["model.dtype=float32", "optim.lr=1e-6"],  # float32 masters keep every step
    ["optim.lr=1e-6"],                         # auto is float32
    [*BF16, "optim.lr=1e-6", "optim.bf16_stochastic_round=true"],
])
def test_lrs_the_masters_resolve_are_accepted(overrides):
    load_config(None, overrides)


def test_the_threshold_is_half_of_bf16s_spacing_at_the_median_weight():
    """The constant's derivation, checked against torch's bf16: half the gap between a typical
    weight (the median |w| of a 0.02-std matrix) and the next bf16 value."""
    median = (torch.randn(100_000) * 0.02).abs().median().to(torch.bfloat16)
    up = torch.nextafter(median, torch.tensor(1.0, dtype=torch.bfloat16))
    assert (up - median).item() / 2 == BF16_MIN_LR


def test_flowrl_zhead_group_below_the_threshold_is_refused():
    """The Z-head is held in the LM's dtype, so its group's lr (lr x zhead_lr_mult) must resolve
    too; GRPO has no Z-head and ignores the multiplier."""
    ok = [*BF16, "optim.lr=1e-4"]
    with pytest.raises(ConfigError, match=r"optim\.lr x flowrl\.zhead_lr_mult=1e-05") as e:
        load_config(None, [*ok, "algo=flowrl", "flowrl.zhead_lr_mult=0.1"])
    assert "model.dtype=bfloat16" in str(e.value)
    load_config(None, [*ok, "algo=grpo", "flowrl.zhead_lr_mult=0.1"])
    load_config(None, [*ok, "algo=flowrl", "flowrl.zhead_lr_mult=0.1", "optim.bf16_stochastic_round=true"])
    load_config(None, [*BF16, "optim.lr=3e-6", "algo=flowrl", "flowrl.zhead_lr_mult=10",
                       "optim.bf16_stochastic_round=true"])


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_stochastic_rounding_without_bf16_masters_is_refused(dtype):
    with pytest.raises(ConfigError, match=rf"optim\.bf16_stochastic_round=true needs model\.dtype=bfloat16.*'{dtype}'"):
        load_config(None, [f"model.dtype={dtype}", "optim.bf16_stochastic_round=true"])


# ---------------------------------------------------------------- make_optimizer, in process


def test_plain_runs_get_torchs_fused_adamw_with_each_groups_lr():
    cfg = load_config(None, ["optim.lr=2e-4", "optim.weight_decay=0.1", "optim.betas=[0.8,0.9]"])
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    opt = make_optimizer([{"params": [a], "lr": 2e-4}, {"params": [b], "lr": 2e-3}], cfg, torch.device("cpu"))
    assert type(opt) is torch.optim.AdamW
    assert [g["lr"] for g in opt.param_groups] == [2e-4, 2e-3]
    assert all(g["fused"] and g["weight_decay"] == 0.1 and g["betas"] == (0.8, 0.9) for g in opt.param_groups)


def test_stochastic_rounding_without_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # what an install without it raises
    cfg = load_config(None, [*BF16, "optim.bf16_stochastic_round=true"])
    with pytest.raises(ConfigError, match=r"optim\.bf16_stochastic_round=true needs torchao.*reasonrl_fast\[bf16\]"):
        make_optimizer([{"params": [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], "lr": 1e-6}],
                       cfg, torch.device("cpu"))


# ---------------------------------------------------------------- torchao, in child processes


@pytest.fixture
def torchao_env(monkeypatch):
    """This test's children find torchao (see `venvs.torchao_pythonpath`)."""
    monkeypatch.setenv("PYTHONPATH", venvs.torchao_pythonpath())


@pytest.mark.proc
def test_stochastic_rounding_tracks_float32_where_bf16_rounds_away(torchao_env):
    """50 AdamW steps at lr 1e-6 on a 0.02-scale matrix, each element's gradient of a fixed sign:
    float32 moves every element by 50 x lr; round-to-nearest bf16 moves only the few elements
    whose step exceeds half their spacing; stochastic rounding moves them by 50 x lr in
    expectation. Tolerances are 5 standard errors of the per-element displacements."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "helpers", "bf16_sr_child.py")],
                       env={**os.environ, "SEED": str(torch.initial_seed() % 2**31), "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    fp32, bf16, sr = r["float32"], r["bfloat16"], r["bfloat16_sr"]
    assert fp32["optimizer"] == bf16["optimizer"] == "torch.optim.adamw.AdamW"
    assert sr["optimizer"].startswith("torchao.optim"), sr["optimizer"]

    def se(*runs):
        return sum(x["std"] ** 2 / x["n"] for x in runs) ** 0.5

    assert abs(fp32["mean"] - 1) < 5 * se(fp32) + 1e-3, fp32  # float32's own rounding: ~1e-4 of lr
    assert abs(sr["mean"] - fp32["mean"]) < 5 * se(sr, fp32), (sr, fp32)
    # a movable element moves by at most about twice its step; the others not at all
    assert bf16["mean"] < 2 * r["movable"] + 5 * se(bf16), (bf16, r["movable"])
    assert sr["mean"] - bf16["mean"] > 5 * se(sr, bf16), (sr, bf16)


@pytest.mark.proc
def test_stochastic_rounding_under_fsdp2_with_two_groups_resumes_bit_for_bit(torchao_env, tmp_path):
    rc, out, err = torchrun("bf16_sr_fsdp_child.py", 2, [str(tmp_path / "checkpoint")], tmp_path, timeout=300)
    assert rc == 0, out[-2000:] + err[-3000:]
    assert "OK 37 parameters on 2 ranks" in out and "resumed step identical" in out, out
