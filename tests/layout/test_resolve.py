"""layout/resolve.py: the one place a run's shape is decided (sharding, dtypes, attention, packing,
fused head, engine memory). The worker builds from `resolve`, and the planner counts bytes from
the same call: these tests pin the rules, that the planner follows flash-attn's install exactly
as a worker would, and that a real CPU run and the planner agree on every field."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from reasonrl_fast import plan
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast import layout
from reasonrl_fast.layout.shape import shape_from_config
from reasonrl_fast.models.tiny import tiny_shape
from reasonrl_fast.layout.shipped_shapes import SHAPES
from reasonrl_fast.rollout import get_rollout
from tests.helpers.train import ROOT, repo_env

CONFIGS = os.path.join(ROOT, "configs")
QWEN7 = {k: v for k, v in SHAPES["Qwen2.5-7B"].items() if not k.startswith("_")}


@pytest.mark.parametrize("master", ["float32", "bfloat16"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("sharding", ["fsdp", "replicate", "none"])
def test_compute_dtype(master, device, sharding):
    auto = layout.compute_dtype("auto", master, device, sharding)
    assert auto == ("bfloat16" if device == "cuda" and sharding == "fsdp" else master)
    if master == "bfloat16" or sharding == "fsdp":
        assert layout.compute_dtype("bfloat16", master, device, sharding) == "bfloat16"
    else:  # only FSDP2's policy casts float32 masters to bf16 for the forward
        with pytest.raises(ConfigError, match="trainer.sharding"):
            layout.compute_dtype("bfloat16", master, device, sharding)
    if master == "float32":
        assert layout.compute_dtype("float32", master, device, sharding) == "float32"
    else:
        with pytest.raises(ConfigError, match="model.dtype"):
            layout.compute_dtype("float32", master, device, sharding)


def test_sharding_mode():
    assert layout.sharding_mode("auto", "cpu", 1) == "none"
    assert layout.sharding_mode("fsdp", "cuda", 1) == "fsdp"
    assert layout.sharding_mode("auto", "cpu", 2) == "replicate"
    assert layout.sharding_mode("auto", "cuda", 2) == "fsdp"
    # offload is FSDP2's: auto takes it at any world and device, replicate cannot
    off = "params+optimizer"
    assert [layout.sharding_mode(s, d, w, off) for s, d, w in (("auto", "cpu", 1), ("auto", "cpu", 2),
                                                                ("fsdp", "cuda", 8))] == ["fsdp"] * 3
    with pytest.raises(ConfigError, match=r"^trainer.offload=params\+optimizer is FSDP2's CPU offload: it needs "
                                          r"trainer.sharding=fsdp or auto, got replicate$"):
        layout.sharding_mode("replicate", "cuda", 2, off)
    with pytest.raises(ConfigError, match=r"trainer.offload"):
        load_config(None, ["trainer.offload=params"])


def _with_flash_attn(monkeypatch, installed: bool):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed else None) if name == "flash_attn" else real(name, *a))


def test_attention_follows_the_install_and_the_compute_dtype(monkeypatch):
    _with_flash_attn(monkeypatch, True)
    assert layout.attention("cuda", "bfloat16")[0] == "flash_attention_2"
    attn, why = layout.attention("cuda", "float32")
    assert attn == "sdpa" and "computes in float32" in why and "trainer.sharding=fsdp" in why
    assert layout.attention("cpu", "bfloat16")[0] == "sdpa"
    _with_flash_attn(monkeypatch, False)
    attn, why = layout.attention("cuda", "bfloat16")
    assert attn == "sdpa" and "not installed" in why


def test_packing_blocker_reads_config_json_as_the_worker_reads_the_model():
    assert layout.packing_blocker(QWEN7) is None
    assert "gpt2" in layout.packing_blocker({"model_type": "gpt2"})
    assert layout.packing_blocker({**QWEN7, "use_sliding_window": True}) == "sliding-window attention"
    assert layout.packing_blocker({"model_type": "mistral", "sliding_window": 4096}) == "sliding-window attention"
    from transformers import Qwen2Config

    assert layout.packing_blocker(Qwen2Config(num_hidden_layers=2)) is None


def _plan_gpu(monkeypatch, flash: bool, extra=()):
    _with_flash_attn(monkeypatch, flash)
    cfg = load_config(os.path.join(CONFIGS, "flowrl_qwen2.5_7b_math.yaml"), ["rollout.backend=hf", *extra])
    return plan.estimate(cfg, shape_from_config(QWEN7, "x"), "gpu", 80.0)


def test_the_planner_counts_sdpa_where_flash_attn_is_absent(monkeypatch):
    """A GPU run with bf16 compute: flash-attn's terms only where flash-attn is installed (the
    worker runs sdpa with a block-diagonal mask otherwise), from the worker's own `resolve`."""
    flash = _plan_gpu(monkeypatch, True)
    sdpa = _plan_gpu(monkeypatch, False)
    assert flash.layout.attention == "flash_attention_2" and flash.layout.one_row
    assert sdpa.layout.attention == "sdpa" and not sdpa.layout.one_row
    assert flash.layout.compute_dtype == sdpa.layout.compute_dtype == "bfloat16"
    f = {t.name: t for t in flash.terms}["activations"]
    s = {t.name: t for t in sdpa.terms}["activations"]
    assert "flash-attn" in f.note and "sdpa" in s.note and "M-element mask" in s.note
    assert s.update > f.update  # the mask and the repeated k/v heads of sdpa
    # the worker's own call, on the same config and device, decides the same
    cfg = load_config(os.path.join(CONFIGS, "flowrl_qwen2.5_7b_math.yaml"), ["rollout.backend=hf"])
    worker = layout.resolve(cfg, QWEN7, "cuda", 8, get_rollout("hf"))
    assert worker == sdpa.layout


def test_fused_head_rule():
    assert layout.fused_head("auto", None, "cuda", 1, 10)[0]
    big = -(-layout.FUSED_CPU_MIN_ELEMENTS // 99)
    assert layout.fused_head("auto", None, "cpu", big, 99)[0] and not layout.fused_head("auto", None, "cpu", big - 1, 99)[0]
    assert not layout.fused_head("auto", "config.logit_scale=2 scales the logits", "cuda", 1, 10)[0]
    with pytest.raises(ConfigError, match="model.fused_lm_head=true"):
        layout.fused_head("true", "the output layer has a bias", "cpu", 1, 10)
    assert layout.config_head_blocker({**QWEN7, "final_logit_softcapping": 30.0}).startswith("config.final_logit")
    assert layout.config_head_blocker({**QWEN7, "logit_scale": 1.0}) is None


def test_the_fused_head_refusal_is_one_rule_for_the_driver_and_the_workers():
    blocker = "the output layer has a bias"
    with pytest.raises(ConfigError, match="model.fused_lm_head=true, but the output layer has a bias") as driver:
        layout.refuse_fused_head("true", blocker)
    with pytest.raises(ConfigError) as worker:
        layout.fused_head("true", blocker, "cuda", 1, 10)
    assert str(worker.value) == str(driver.value)
    for setting in ("auto", "false"):
        layout.refuse_fused_head(setting, blocker)
    layout.refuse_fused_head("true", None)


def test_the_packing_refusal_is_one_rule_for_preflight_and_the_workers():
    gpt2 = {"model_type": "gpt2"}
    with pytest.raises(ConfigError, match=r"data.packing=true: model_type 'gpt2'") as preflight:
        layout.refuse_packing("true", gpt2)
    with pytest.raises(ConfigError) as worker:
        layout.packing("true", gpt2, "sdpa")
    assert str(worker.value) == str(preflight.value)
    assert "gpt2" in layout.refuse_packing("auto", gpt2) and "gpt2" in layout.refuse_packing("false", gpt2)
    assert layout.refuse_packing("true", QWEN7) is None


def test_mini_batch_count_is_the_ceiling_of_prompts_over_the_mini_batch():
    for p in range(1, 41):
        for mb in range(1, 50):
            assert layout.mini_batch_count(p, mb) == -(-p // min(mb, p)) == math.ceil(p / min(mb, p)), (p, mb)
    assert layout.mini_batch_count(512, 32) == 16 and layout.mini_batch_count(5, 3) == 2
    assert layout.mini_batch_count(8, 64) == 1  # a mini-batch larger than the step is the whole step
    cfg = load_config(None, ["data.prompts_per_step=5", "optim.mini_batch_prompts=3", "rollout.n=2"])
    assert len(layout.mini_batches(cfg, 5)) == layout.mini_batch_count(5, 3)


def test_layout_imports_no_torch():
    code = ("import sys; import reasonrl_fast.layout, reasonrl_fast.layout.micro, reasonrl_fast.layout.shape; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=repo_env(), check=True)


def test_a_cpu_run_and_the_planner_agree_on_every_field(trained_run):
    """The shared run's workers wrote the Layout they built from (layout.json); the planner's
    `resolve` on the run's own config and device gives the same, field by field."""
    with open(trained_run.dir / "layout.json") as f:
        ran = json.load(f)
    cfg = load_config(str(trained_run.dir / "config.yaml"), [])
    planned = plan.estimate(cfg, tiny_shape(cfg.model), "cpu", 64.0).layout.to_dict()
    assert ran == planned
    assert ran["sharding"] == "fsdp" and ran["device"] == "cpu" and ran["packed"]


# ---------------------------------------------------------------- tensor-parallel rollout


def _tp(size: int, **fields):
    cfg = load_config(None, ["rollout.backend=vllm", f"rollout.tensor_parallel_size={size}",
                             "trainer.workers_per_node=8"])
    return layout.tensor_parallel(cfg, {**QWEN7, **fields})


def test_tensor_parallel_follows_the_heads_as_vllm_splits_them():
    """Qwen2.5-7B: 28 heads, 4 key/value heads, MLP 18944. TP 2 and 4 split all three; TP 8 does
    not divide 28 heads; a model with 2 key/value heads takes TP 4 (each replicated on 2 ranks)
    but not 3 heads' worth (TP 4 with 12 heads and 3 kv heads: 4 is no multiple of 3)."""
    assert _tp(1) == 1 and _tp(2) == 2 and _tp(4) == 4
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=8 does not divide the model's num_attention_heads=28"):
        _tp(8)
    assert _tp(4, num_attention_heads=8, num_key_value_heads=2, intermediate_size=64) == 4
    with pytest.raises(ConfigError, match=r"not a multiple of the model's num_key_value_heads=3"):
        _tp(4, num_attention_heads=12, num_key_value_heads=3, intermediate_size=64)
    with pytest.raises(ConfigError, match=r"num_key_value_heads=6"):
        _tp(4, num_attention_heads=12, num_key_value_heads=6, intermediate_size=64)
    with pytest.raises(ConfigError, match=r"intermediate_size=18"):
        _tp(4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=18)


def test_the_layout_carries_the_engine_ranks_and_a_ranks_kv_cache():
    """The embedded default (4 heads of 32, 2 key/value heads, 2 layers, fp32) on 2 CPU workers:
    TP 2 gives the one engine both workers' prompts (2 x 8 = 16 x 8 samples = 128 sequences of
    16 + 32 = 48 tokens, one 128-token block each) and each rank one key/value head, so a rank's
    cache is the same bytes as a TP-1 worker's (64 sequences of 2 heads): 2 x 2 layers x 1 head
    x 32 x 4 bytes = 512 bytes a token, ceil(128 x 1.05) + 1 = 136 blocks."""
    from reasonrl_fast.models.tiny import tiny_config

    one = load_config(None, ["rollout.backend=vllm"])
    two = load_config(None, ["rollout.backend=vllm", "rollout.tensor_parallel_size=2"])
    vllm = get_rollout("vllm")
    a = layout.resolve(one, tiny_config(one.model), "cpu", 2, vllm)
    b = layout.resolve(two, tiny_config(two.model), "cpu", 2, vllm)
    assert (a.engine_tp, b.engine_tp) == (1, 2)
    assert b.kv_cache_bytes == 136 * 128 * 512
    assert a.kv_cache_bytes == (math.ceil(64 * 1.05) + 1) * 128 * 1024
