"""Each shipped recipe holds the settings of the published run it names (docs/recipes.md): the
values below are copied from those runs' scripts, not from the configs, so a config that drifts
fails here. No Ray, no model."""

import os

import pytest

from reasonrl_fast.config import load_config

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")

# verl's FSDP actor defaults (verl/trainer/config/optim/fsdp.yaml): betas (0.9, 0.999)
VERL = {"optim.betas": [0.9, 0.999], "optim.lr": 1e-6, "optim.grad_clip": 1.0, "model.dtype": "float32",
        "grpo.loss_agg": "token-mean", "grpo.kl_coef": 0.0}

# verl recipe/fapo/run_fapo_7b.sh, run_baseline_7b.sh, run_fapo_32b.sh
FAPO = {**VERL, "optim.warmup_steps": 10, "optim.weight_decay": 0.1, "grpo.clip_low": 0.2,
        "grpo.clip_high": 0.28, "grpo.clip_ratio_c": 10.0, "rollout.n": 8, "data.prompts_per_step": 512,
        "optim.mini_batch_prompts": 32, "data.max_prompt_length": 2048, "grpo.overlong_buffer": 4096,
        "grpo.overlong_factor": 1.0, "rollout.temperature": 1.0, "rollout.top_p": 1.0,
        "rollout.val_temperature": 1.0, "rollout.val_top_p": 0.7}
GENRM_CLIENT = {"fapo.penalty": 1.0, "fapo.genrm.template": "published", "fapo.genrm.max_tokens": 16384}
# run_fapo_32b.sh and run_baseline_32b.sh's policy: 2 nodes of 8 GPUs (the FAPO script's NNODES;
# the baseline's says 8 nodes, docs/recipes.md), offload=True, sp_size=8, gen_tp=4 at 0.80
FAPO_32B = {"trainer.nnodes": 2, "trainer.workers_per_node": 8, "trainer.offload": "params+optimizer",
            "trainer.sequence_parallel_size": 8, "rollout.tensor_parallel_size": 4,
            "rollout.gpu_memory_utilization": 0.8}

PUBLISHED = {
    # the paper's: Xuekai-Zhu/FlowRL verl@FlowRL/command/training/math/flowrl_7B_math.sh (F1);
    # validation: the paper's Avg@16 at T 0.6 / top-p 0.95
    "flowrl_qwen2.5_7b_math.yaml": {
        **VERL, "algo": "flowrl", "optim.warmup_steps": 10, "optim.weight_decay": 0.1, "rollout.n": 8,
        "data.prompts_per_step": 512, "optim.mini_batch_prompts": 32, "data.max_prompt_length": 2048,
        "rollout.max_new_tokens": 8192, "flowrl.overlong_buffer": 0, "flowrl.max_is_weight": 1e30,
        "rollout.temperature": 1.0, "rollout.top_p": 1.0, "flowrl.beta": 15.0, "flowrl.zhead_layers": 3,
        "rollout.gpu_memory_utilization": 0.6, "rollout.val_temperature": 0.6, "rollout.val_top_p": 0.95,
        "trainer.save_every": 50,
        "flowrl.zhead_pooling": "published"},  # F1a: full_last_hidden[:, :-response_length - 1]
    # verl-recipe flowrl/run_flowrl_qwen2.5_7b.sh (vF): gen_batch_size 1536 trained whole, overlong, cap 10
    "flowrl_qwen2.5_7b_math_verl.yaml": {
        **VERL, "algo": "flowrl", "optim.warmup_steps": 10, "optim.weight_decay": 0.1, "rollout.n": 8,
        "data.prompts_per_step": 1536, "optim.mini_batch_prompts": 32, "data.max_prompt_length": 2048,
        "rollout.max_new_tokens": 8192, "flowrl.overlong_buffer": 4096, "flowrl.overlong_factor": 1.0,
        "flowrl.max_is_weight": 10.0, "rollout.temperature": 1.0, "rollout.top_p": 1.0, "flowrl.beta": 15.0,
        "rollout.val_temperature": 1.0, "rollout.val_top_p": 0.7, "rollout.val_n": 1, "trainer.val_every": 10,
        "flowrl.zhead_pooling": "published"},  # vFa: full_last_hidden[:, :-response_length - 1]
    "fapo_qwen2.5_math_7b.yaml": {
        **FAPO, **GENRM_CLIENT, "algo": "fapo", "rollout.max_new_tokens": 8192, "trainer.steps": 200,
        "model.max_position_embeddings": 32768, "trainer.val_every": 10},
    "grpo_baseline_qwen2.5_math_7b.yaml": {
        **FAPO, "algo": "grpo", "rollout.max_new_tokens": 8192, "trainer.steps": 200,
        "model.max_position_embeddings": 32768, "trainer.val_every": 10},
    "fapo_qwen2.5_32b.yaml": {
        **FAPO, **GENRM_CLIENT, **FAPO_32B, "algo": "fapo", "rollout.max_new_tokens": 20480, "trainer.steps": 600,
        "trainer.val_every": 10},
    # verl recipe/fapo/run_baseline_32b.sh: run_fapo_32b.sh without the GenRM
    "fapo_baseline_qwen2.5_32b.yaml": {
        **FAPO, **FAPO_32B, "algo": "grpo", "rollout.max_new_tokens": 20480, "trainer.steps": 600,
        "trainer.val_every": 10},
    # Megatron-LM examples/rl: README, model_configs/qwen_2p5_32b.sh, common.sh
    "grpo_qwen2.5_32b_dapo.yaml": {
        "algo": "grpo", "model.dtype": "float32", "optim.lr": 1e-6, "optim.warmup_steps": 0,
        "optim.weight_decay": 0.0, "optim.betas": [0.9, 0.95], "optim.grad_clip": 1.0, "rollout.n": 16,
        "data.prompts_per_step": 64, "optim.mini_batch_prompts": 64, "grpo.clip_low": 0.2, "grpo.clip_high": 0.28,
        "grpo.kl_coef": 0.0, "grpo.loss_agg": "token-mean", "grpo.overlong_buffer": 0, "rollout.val_n": 32,
        "trainer.steps": 300, "trainer.val_every": 20, "trainer.save_every": 20,
        "rollout.max_sequence_tokens": 12000, "rollout.max_new_tokens": 12000},  # its MAX_SEQ_LENGTH caps both
    # verl recipe/fapo/run_fapo_genrm_train.sh
    "fapo_genrm_qwen3_4b.yaml": {
        **VERL, "algo": "grpo", "optim.warmup_steps": 10, "optim.weight_decay": 0.1, "grpo.clip_low": 0.2,
        "grpo.clip_high": 0.28, "grpo.clip_ratio_c": 10.0, "rollout.n": 16, "data.prompts_per_step": 512,
        "optim.mini_batch_prompts": 32, "data.max_prompt_length": 5120, "rollout.max_new_tokens": 8192,
        "grpo.overlong_buffer": 4096, "grpo.overlong_factor": 1.0, "rollout.temperature": 1.2,
        "rollout.top_p": 1.0, "rollout.val_temperature": 0.6, "rollout.val_top_p": 0.95, "rollout.val_n": 1,
        "trainer.steps": 500, "trainer.save_every": 10, "trainer.val_every": 10,
        "trainer.nnodes": 4, "trainer.workers_per_node": 8},
}


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_recipe_holds_the_published_settings(name):
    cfg = load_config(os.path.join(CONFIGS, name))
    want = PUBLISHED[name]
    got = {k: _get(cfg, k) for k in want}
    assert got == want


def test_every_recipe_is_checked():
    shipped = {f for f in os.listdir(CONFIGS) if f.endswith(".yaml")}
    assert shipped - set(PUBLISHED) == {"default.yaml", "genrm_default.yaml"}  # the embedded toys


@pytest.mark.parametrize("name", [n for n in PUBLISHED if n.startswith("fapo_qwen")])
def test_fapo_genrm_is_sampled_with_room_for_its_verdicts(name):
    g = load_config(os.path.join(CONFIGS, name)).fapo.genrm
    assert g.temperature > 0 and len(g.addresses) >= 2  # sampled, as the published client leaves it to the server
    assert g.timeout_s >= g.max_tokens / 60  # 16384 tokens at ~60 tokens/s
    assert "vllm serve" in open(os.path.join(CONFIGS, name)).read()  # how to start the replicas


# The papers' validation, per benchmark: (name, samples per prompt, scorer) of each set
VAL_SETS = {
    # FlowRL: Avg@16 on each of six benchmarks
    "flowrl_qwen2.5_7b_math.yaml": [(name, 16, None) for name in ("aime24", "aime25", "amc23", "math500", "minerva",
                                                                  "olympiadbench")],
    # FAPO's test file: 32 copies of each AIME24 and AIME25 prompt and 4 of each GPQA-Diamond one, box verifier
    **{name: [("aime24", 32, "boxed"), ("aime25", 32, "boxed"), ("gpqa_diamond", 4, "boxed")]
       for name in ("fapo_qwen2.5_math_7b.yaml", "grpo_baseline_qwen2.5_math_7b.yaml", "fapo_qwen2.5_32b.yaml",
                    "fapo_baseline_qwen2.5_32b.yaml")},
}


@pytest.mark.parametrize("name", sorted(VAL_SETS))
def test_recipe_validates_per_benchmark_as_its_paper_reports(name):
    sets = load_config(os.path.join(CONFIGS, name)).data.val_sets
    assert [(v.name, v.n, v.scorer) for v in sets] == VAL_SETS[name]
    assert all(v.temperature is None and v.top_p is None for v in sets)  # the recipe's val_temperature / val_top_p
