"""The GenRM task's configuration (budgets, warm-start cache key) and the GenRM presets (the
recipes' published settings: tests/test_recipes.py). No Ray."""

import os

import pytest

from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.trainer.sft import sft_cache_path

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def preset(name):
    return load_config(os.path.join(CONFIGS, name))


def test_genrm_training_preset():
    c = preset("fapo_genrm_qwen3_4b.yaml")
    assert (c.algo, c.rollout.n, c.rollout.temperature) == ("grpo", 16, 1.2)
    assert "Qwen3-4B" in c.model.path and c.trainer.nnodes * c.trainer.workers_per_node == 32


def test_embedded_genrm_config():
    c = preset("genrm_default.yaml")
    assert (c.data.task, c.algo, c.model.path, c.data.train_files) == ("genrm", "grpo", "", [])


@pytest.mark.parametrize("override,key", [
    ("data.max_prompt_length=27", "data.max_prompt_length"),   # the 2-digit prompt needs 28
    ("rollout.max_new_tokens=16", "rollout.max_new_tokens"),   # 'ok,ok \boxed{-1}' + EOS: 17
    ("model.max_position_embeddings=40", "model.max_position_embeddings"),
])
def test_genrm_budgets_name_the_key(override, key):
    base = ["data.task=genrm", "data.digits=2", "data.max_prompt_length=28", "rollout.max_new_tokens=17"]
    load_config(None, base)  # exactly enough
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, base + [override])


def test_genrm_warm_start_has_its_own_cache():
    addition = sft_cache_path(load_config())
    assert sft_cache_path(load_config(None, ["data.task=code"])) == addition  # code keeps addition's
    genrm = sft_cache_path(load_config(None, ["data.task=genrm", "data.max_prompt_length=28"]))
    assert genrm != addition
