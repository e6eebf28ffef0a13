"""The driver's preflight (reasonrl_fast/preflight.py) and what it reads: the model's context
(model.max_position_embeddings or config.json's) against the prompt and response, the GenRM's
context, the shape check the planner shares, and the context override reaching the Hugging Face
model and the vLLM engine's arguments. No Ray, no weights beyond a two-layer model."""

import inspect
import os

import pytest
import torch
from transformers import GPT2Config, Qwen2Config, Qwen3Config

from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError, UserError
from reasonrl_fast.layout.shape import check_shape, context_overrides, model_context, shape_from_config
from reasonrl_fast.layout.shipped_shapes import SHAPES
from reasonrl_fast.preflight import preflight
from tests.helpers.train import ROOT

CONFIGS = os.path.join(ROOT, "configs")
MATH_7B_RECIPES = ["fapo_qwen2.5_math_7b.yaml", "grpo_baseline_qwen2.5_math_7b.yaml"]


def shipped(name):
    """The transformers config of a shipped shape, as the rehearsal builds it."""
    d = {k: v for k, v in SHAPES[name].items() if not k.startswith("_")}
    return (Qwen3Config if d["model_type"] == "qwen3" else Qwen2Config)(**d)


def math_7b_run(*overrides):
    """The Math-7B recipes' lengths on the default config: 2048-token prompts, 8192-token responses."""
    return load_config(None, ["model.path=/models/Qwen2.5-Math-7B", "data.max_prompt_length=2048",
                              "rollout.max_new_tokens=8192", *overrides])


# ---------------------------------------------------------------- the model's context


def test_math_7b_context_fails_in_one_line_naming_the_setting():
    config = shipped("Qwen2.5-Math-7B")
    assert config.max_position_embeddings == 4096
    with pytest.raises(ConfigError) as e:
        preflight(math_7b_run(), config, files=False)
    line = str(e.value)
    assert "\n" not in line and line.startswith("model.max_position_embeddings")
    assert all(s in line for s in ("4096", "2048 + 8192 = 10240", "model.max_position_embeddings=10240"))


def test_a_sequence_cap_is_the_longest_sequence_the_context_must_hold():
    with pytest.raises(ConfigError, match=r"^model\.max_position_embeddings=6000: below "
                                          r"rollout\.max_sequence_tokens = 6500; raise it to at least 6500"):
        preflight(math_7b_run("model.max_position_embeddings=6000", "rollout.max_sequence_tokens=6500"),
                  shipped("Qwen2.5-7B"), files=False)
    preflight(math_7b_run("model.max_position_embeddings=6500", "rollout.max_sequence_tokens=6500"),
              shipped("Qwen2.5-7B"), files=False)


@pytest.mark.parametrize("value", [10240, 32768])
def test_the_override_lets_math_7b_run(value):
    cfg = math_7b_run(f"model.max_position_embeddings={value}")
    assert preflight(cfg, shipped("Qwen2.5-Math-7B"), files=False).max_position_embeddings == 4096


def test_an_override_below_the_run_names_its_value():
    with pytest.raises(ConfigError, match=r"^model\.max_position_embeddings=8000: below .* = 10240"):
        preflight(math_7b_run("model.max_position_embeddings=8000"), shipped("Qwen2.5-7B"), files=False)


@pytest.mark.parametrize("name", MATH_7B_RECIPES)
def test_math_7b_recipes_pass_with_their_setting_and_fail_without(name):
    path = os.path.join(CONFIGS, name)
    cfg = load_config(path)
    need = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    assert need > 4096 and model_context(cfg.model.max_position_embeddings, shipped("Qwen2.5-Math-7B")) >= need
    preflight(cfg, shipped("Qwen2.5-Math-7B"), files=False)
    with pytest.raises(ConfigError, match="model.max_position_embeddings"):
        preflight(load_config(path, ["model.max_position_embeddings=null"]), shipped("Qwen2.5-Math-7B"), files=False)


def test_shipped_shapes_carry_their_context():
    want = {"Qwen2.5-Math-7B": 4096, "Qwen2.5-7B": 131072, "Qwen2.5-32B": 131072, "Qwen3-4B-Instruct-2507": 262144}
    assert {name: model_context(None, d) for name, d in SHAPES.items()} == want
    assert SHAPES["Qwen2.5-Math-7B"]["rope_theta"] == 10000.0
    for name in SHAPES:
        check_shape(SHAPES[name], name)
        check_shape(shipped(name), name)


def test_context_is_read_through_the_config_as_transformers_reads_it():
    assert model_context(None, GPT2Config(n_positions=77)) == 77  # GPT-2 names it n_positions
    assert model_context(None, {"text_config": {"hidden_size": 8, "max_position_embeddings": 99}}) == 99
    assert model_context(None, {"hidden_size": 8}) is None
    assert model_context(512, {"max_position_embeddings": 99}) == 512
    assert context_overrides(None) == {} and context_overrides(512) == {"max_position_embeddings": 512}


def test_embedded_model_context_defaults_to_256_and_follows_the_setting():
    from reasonrl_fast.models.tiny import TINY_CONTEXT, tiny_config

    cfg = load_config()
    assert cfg.model.max_position_embeddings is None
    assert tiny_config(cfg.model).max_position_embeddings == TINY_CONTEXT == 256
    preflight(cfg, files=False)
    long = load_config(None, ["data.max_prompt_length=200", "rollout.max_new_tokens=100"])
    with pytest.raises(ConfigError, match=r"context is 256 tokens .*embedded model.* = 300"):
        preflight(long, files=False)
    preflight(load_config(None, ["data.max_prompt_length=200", "rollout.max_new_tokens=100",
                                 "model.max_position_embeddings=300"]), files=False)


def test_unset_context_keeps_the_warm_start_cache_key():
    from reasonrl_fast.trainer.sft import sft_cache_path

    assert sft_cache_path(load_config()) == sft_cache_path(load_config(None, ["model.max_position_embeddings=256"]))
    assert sft_cache_path(load_config()) != sft_cache_path(load_config(None, ["model.max_position_embeddings=512"]))


@pytest.mark.parametrize("bad", ["0", "-4"])
def test_non_positive_override_is_refused_at_load(bad):
    with pytest.raises(ConfigError, match=f"model.max_position_embeddings={bad}: must be > 0"):
        load_config(None, [f"model.max_position_embeddings={bad}"])


# ---------------------------------------------------------------- the GenRM's context


def _genrm_dir(tmp_path, context):
    Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=100, max_position_embeddings=context).save_pretrained(tmp_path)
    return tmp_path


def test_genrm_served_here_must_hold_a_verdict_request(tmp_path):
    path = _genrm_dir(tmp_path / "genrm", 256)
    base = ["algo=fapo", f"fapo.genrm.serve=hf:{path}"]  # 16 + 32 policy tokens by default
    with pytest.raises(ConfigError) as e:
        preflight(load_config(None, base + ["fapo.genrm.max_tokens=300"]), files=False)
    assert str(e.value).startswith("fapo.genrm.max_tokens=300:") and "16 + 32 + 300 = 348" in str(e.value)
    assert "lower fapo.genrm.max_tokens to 208" in str(e.value)
    preflight(load_config(None, base + ["fapo.genrm.max_tokens=208"]), files=False)
    # a GenRM elsewhere, not readable here, or asked through addresses is not ours to check
    preflight(load_config(None, ["algo=fapo", f"fapo.genrm.serve=hf:{tmp_path / 'absent'}",
                                 "fapo.genrm.max_tokens=300"]), files=False)
    preflight(load_config(None, base + ["fapo.genrm.max_tokens=300", "fapo.genrm.addresses=[127.0.0.1:9]"]),
              files=False)
    preflight(load_config(None, ["algo=grpo", f"fapo.genrm.serve=hf:{path}", "fapo.genrm.max_tokens=300"]),
              files=False)


# ---------------------------------------------------------------- the shape check


GOOD = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100)


@pytest.mark.parametrize("change,says", [
    ({"hidden_size": None}, "no hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers=0: sizes must be positive integers"),
    ({"vocab_size": -5}, "vocab_size=-5"),
    ({"intermediate_size": 12.5}, "intermediate_size=12.5"),
    ({"num_attention_heads": True}, "num_attention_heads=True"),
    ({"num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    ({"hidden_size": 66}, "hidden_size=66 is not num_attention_heads=4 x a head size"),
    ({"max_position_embeddings": 0}, "max_position_embeddings=0"),
], ids=lambda x: str(x))
def test_shape_check_names_the_bad_field(change, says):
    d = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        check_shape(d, "model.path='/m': config.json")
    assert str(e.value).startswith("model.path='/m': config.json: ") and says in str(e.value), str(e.value)


def test_shape_check_accepts_an_explicit_head_dim_and_checks_the_vocabulary():
    check_shape({**GOOD, "hidden_size": 66, "head_dim": 16}, "x")  # Qwen3-style: heads x head_dim != hidden
    check_shape({**GOOD, "num_key_value_heads": None}, "x")  # no GQA: as many key/value heads as heads
    check_shape(GOOD, "x", vocab=100)
    with pytest.raises(ConfigError, match="vocab_size=100 is below the tokenizer's 101 tokens"):
        check_shape(GOOD, "x", vocab=101)


def test_planner_refuses_what_preflight_refuses():
    from reasonrl_fast import plan

    with pytest.raises(ConfigError, match="is not a multiple of num_key_value_heads=3"):
        shape_from_config({**GOOD, "num_key_value_heads": 3}, "x")


def test_preflight_checks_the_embedded_shape():
    with pytest.raises(ConfigError, match=r"^the embedded model built from model\.\*: num_attention_heads=5"):
        preflight(load_config(None, ["model.num_heads=5", "model.hidden_size=160"]), files=False)


# ---------------------------------------------------------------- the files, in order


def _model_dir(path, vocab_size=None, context=64):
    """A two-layer Qwen2 with the character tokenizer (vocab_size: the tokenizer's when None)."""
    from transformers import AutoModelForCausalLM

    from reasonrl_fast.models.tiny import char_tokenizer

    tok = char_tokenizer()
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=vocab_size or len(tok), max_position_embeddings=context,
                         tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_context_fails_before_the_files_and_the_run_directory(tmp_path):
    cfg = load_config(None, [f"data.train_files=[{tmp_path / 'none.jsonl'}]", "rollout.max_new_tokens=300",
                             f"trainer.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="model.max_position_embeddings"):
        preflight(cfg)
    assert not (tmp_path / "run").exists()
    cfg.rollout.max_new_tokens = 32
    with pytest.raises(UserError, match="data.train_files: .*none.jsonl: no such file"):
        preflight(cfg)
    preflight(cfg, files=False)  # the rehearsal's machine has no data


def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    path = _model_dir(tmp_path / "m", vocab_size=50)
    cfg = load_config(None, [f"model.path={path}", f"trainer.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"config.json of model.path=.*: vocab_size=50 is below the tokenizer's"):
        preflight(cfg)
    preflight(cfg, files=False)  # no tokenizer at hand: not checked


def test_missing_model_directory_is_one_line(tmp_path):
    with pytest.raises(UserError, match="model.path=.*: no such directory"):
        preflight(load_config(None, [f"model.path={tmp_path / 'nope'}"]), files=False)


def test_fused_head_refused_before_the_cluster():
    from transformers import Gemma2Config

    config = Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, vocab_size=100, final_logit_softcapping=30.0)
    with pytest.raises(ConfigError, match="model.fused_lm_head=true, but config.final_logit_softcapping"):
        preflight(load_config(None, ["model.path=/m", "model.fused_lm_head=true"]), config, files=False)
    preflight(load_config(None, ["model.path=/m", "model.fused_lm_head=auto"]), config, files=False)


def test_packing_refused_before_the_cluster_in_the_workers_words():
    from reasonrl_fast.layout import packing

    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=4096)
    with pytest.raises(ConfigError, match=r"data.packing=true: model_type 'gpt2'") as driver:
        preflight(load_config(None, ["model.path=/m", "data.packing=true"]), config, files=False)
    with pytest.raises(ConfigError) as worker:
        packing("true", config, "sdpa")
    assert str(driver.value) == str(worker.value)
    preflight(load_config(None, ["model.path=/m", "data.packing=auto"]), config, files=False)


def test_missing_torchao_for_stochastic_rounding_is_refused_before_the_cluster(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torchao(name, *args, **kwargs):  # torchao is an optional extra: as if not installed
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    cfg = load_config(None, ["model.dtype=bfloat16", "optim.lr=1e-6", "optim.bf16_stochastic_round=true"])
    with pytest.raises(ConfigError, match=r"optim\.bf16_stochastic_round=true needs torchao.*reasonrl_fast\[bf16\]"):
        preflight(cfg, files=False)
    preflight(load_config(None, ["model.dtype=bfloat16", "optim.lr=1e-4"]), files=False)  # not asked: not imported


# ---------------------------------------------------------------- the override reaches the models


def test_override_reaches_the_hf_model_and_its_config(tmp_path):
    from reasonrl_fast.models.loading import load_model, load_model_config

    path = str(_model_dir(tmp_path / "m", context=64))
    plain = load_model(path)
    longer = load_model(path, max_position_embeddings=512)
    assert plain.config.max_position_embeddings == 64 and longer.config.max_position_embeddings == 512
    assert longer.config.rope_parameters == plain.config.rope_parameters  # θ unchanged
    assert load_model_config(path, 512).max_position_embeddings == 512
    assert load_model_config(path).max_position_embeddings == 64
    for a, b in zip(plain.state_dict().values(), longer.state_dict().values()):
        assert torch.equal(a, b)


def test_override_reaches_the_vllm_engine_arguments(monkeypatch):
    from reasonrl_fast.layout import resolve
    from reasonrl_fast.layout.shape import model_fields
    from types import SimpleNamespace

    from reasonrl_fast.rollout import get_rollout
    from reasonrl_fast.rollout import vllm as rollout_vllm

    cpu = torch.device("cpu")
    args = rollout_vllm.engine_args("/m", torch.float32, 10240, 0, cpu, None, 32768, 2**20)
    assert args["hf_overrides"] == {"max_position_embeddings": 32768} and args["max_model_len"] == 10240
    assert rollout_vllm.engine_args("/m", torch.float32, 48, 0, cpu, kv_cache_memory_bytes=2**20)["hf_overrides"] == {}

    seen = {}
    signature = inspect.signature(rollout_vllm.VLLMEngine.__init__)

    class Recorder:  # the engine's arguments as its spec's `build` passes them, without an engine
        def __init__(self, *args, **kwargs):
            a = signature.bind(self, *args, **kwargs).arguments
            seen["args"] = rollout_vllm.engine_args(a["model_path"], a["dtype"], a["max_model_len"], a["seed"],
                                                    a["device"], a["gpu_memory_utilization"],
                                                    a["max_position_embeddings"], a["kv_cache_memory_bytes"])

    monkeypatch.setattr(rollout_vllm, "VLLMEngine", Recorder)
    cfg = math_7b_run("rollout.backend=vllm", "model.max_position_embeddings=32768")
    config = model_fields("/models/Qwen2.5-Math-7B", "x")[0]  # its shipped shape
    layout = resolve(cfg, config, "cpu", 8, get_rollout("vllm"))
    get_rollout("vllm").build(cfg, layout, None, "/models/Qwen2.5-Math-7B", SimpleNamespace(eos_token_id=1), device=cpu)
    assert seen["args"]["hf_overrides"] == {"max_position_embeddings": 32768}
    assert seen["args"]["max_model_len"] == 2048 + 8192


ENGINE_CONFIG_CHECK = """
import sys, torch
from transformers import Qwen2Config
from vllm.engine.arg_utils import EngineArgs
from reasonrl_fast.rollout.vllm import engine_args
Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=100, max_position_embeddings=64, architectures=["Qwen2ForCausalLM"]).save_pretrained(sys.argv[1])
cpu = torch.device("cpu")
config = EngineArgs(**engine_args(sys.argv[1], torch.float32, 128, 0, cpu, None, 128, 2**20)).create_model_config()
assert (config.max_model_len, config.hf_config.max_position_embeddings) == (128, 128), config
try:
    EngineArgs(**engine_args(sys.argv[1], torch.float32, 128, 0, cpu, kv_cache_memory_bytes=2**20)).create_model_config()
except Exception as e:
    assert "max_model_len" in str(e), e
else:
    raise AssertionError("vLLM took a max_model_len above config.json's without the override")
print("ok")
"""


def test_vllm_takes_the_overridden_context(vllm_python, tmp_path):
    """vLLM 0.32 itself, its model config only (no engine): 128 positions asked of a 64-position
    config.json pass with model.max_position_embeddings=128 in `hf_overrides`, fail without."""
    import subprocess

    from tests.helpers import venvs

    p = subprocess.run([str(vllm_python), "-c", ENGINE_CONFIG_CHECK, str(tmp_path / "m")], cwd=venvs.REPO,
                       env=venvs.child_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1:] == ["ok"], p.stdout[-2000:] + p.stderr[-3000:]


def test_a_tensor_parallel_size_the_heads_do_not_split_stops_the_preflight():
    """Qwen2.5-7B's 28 heads over 8 engine ranks: one line naming both, before Ray or vLLM; 4
    ranks split its 28 heads and 4 key/value heads."""
    run = ["model.path=/models/Qwen2.5-7B", "rollout.backend=vllm", "trainer.workers_per_node=8"]
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size=8 does not divide the model's "
                                          r"num_attention_heads=28"):
        preflight(load_config(None, [*run, "rollout.tensor_parallel_size=8"]), shipped("Qwen2.5-7B"), files=False)
    preflight(load_config(None, [*run, "rollout.tensor_parallel_size=4"]), shipped("Qwen2.5-7B"), files=False)


# ---------------------------------------------------------------- the planner's static checks


def test_a_kv_budget_below_one_full_sequence_is_refused_as_the_planner_says(tmp_path):
    """rollout.kv_cache_memory_bytes too small for one prompt + response: the planner's problem
    (vLLM would not start) stops the preflight, on the recipe's GPU (files=False: bf16 cache) and on
    this machine; a budget that holds one sequence passes."""
    from reasonrl_fast import plan

    path = os.path.join(CONFIGS, "grpo_baseline_qwen2.5_math_7b.yaml")
    config = shipped("Qwen2.5-7B")
    s = shape_from_config(SHAPES["Qwen2.5-7B"], "x")
    cfg = load_config(path, ["rollout.backend=vllm", "rollout.kv_cache_memory_bytes=1000"])
    said = [p for p in plan.estimate(cfg, s, "gpu", 80.0).problems if "holds less than one" in p]
    assert said
    with pytest.raises(ConfigError) as e:
        preflight(cfg, config, files=False)
    assert str(e.value) == said[0]
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    one = plan.kv_bytes(s, 1, seq, 2)  # bf16 on a GPU
    preflight(load_config(path, ["rollout.backend=vllm", f"rollout.kv_cache_memory_bytes={one}"]), config,
              files=False)
    with pytest.raises(ConfigError, match=f"kv_cache_memory_bytes={one - 1} holds less than one {seq}-token"):
        preflight(load_config(path, ["rollout.backend=vllm", f"rollout.kv_cache_memory_bytes={one - 1}"]), config,
                  files=False)


def test_a_tool_that_cannot_be_one_is_named_before_anything_starts():
    for spec, why in [("tests.helpers.tool_fns:undocumented", "has no tool schema"),
                      ("tests.helpers.nowhere:fn", "cannot be imported")]:
        with pytest.raises(ConfigError, match=f"rollout.tools: '{spec}' {why}"):
            preflight(load_config(None, [f"rollout.tools=['{spec}']"]), files=False)
    preflight(load_config(None, ["rollout.tools=[calculator, python, 'tests.helpers.tool_fns:shout']"]), files=False)
