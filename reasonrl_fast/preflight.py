"""`preflight(cfg)`: the checks of a training run that can fail before a model, a GenRM server or
Ray starts, in one place. Each failure is one line naming the setting: a ConfigError, or the
UserError of the thing checked (a data file's DataError, the run directory's CheckpointError, a
model directory's ModelPathError). The train command runs it first; the rehearsal of a recipe
(`python -m reasonrl_fast.rehearse`) runs it with the recipe model's config and `files=False`,
on a machine without the weights or the data.

Cheap first: the model's config (its shape, then its context against the prompt and response),
the GenRM's context, a rollout.tensor_parallel_size that does not divide its heads, packing
forced on a family that cannot pack; then, on the user's machine,
more nodes than a local instance has, the data files, the reward function, the run directory,
the model's weight files and the tokenizer; then the model built on
the meta device (a class the trainer cannot train, a head it cannot fuse), a KV cache in bytes
too small for one full-length sequence (the planner's check), torchao
for bf16 stochastic rounding and the rollout engine's own check (vLLM: imported, and the
architecture against its list). What needs the warm-started model (the data against its
tokenizer) or the run directory's checkpoints stays in the trainer (trainer/loop.py)."""

from __future__ import annotations

import json
import os

from reasonrl_fast.algos import get_algo
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout.shape import check_context, check_shape, genrm_context_problem


def preflight(cfg, model_config=None, *, files: bool = True):
    """Run every check on `cfg` (a validated Config); returns the policy's transformers config.

    `model_config`: the policy's `transformers.PretrainedConfig`; None reads model.path's
    config.json, or for the embedded tiny model (model.path empty) builds the config its model
    section gives. `files=False` skips what only the user's machine can answer: the data files,
    the reward function, the run directory, the weight files, the tokenizer's size, the rollout
    engine's install (`EngineSpec.preflight`) and trainer.nnodes against a local instance (a recipe
    names the nodes of its cluster)."""
    if model_config is None:
        model_config, source = _policy_config(cfg)
    else:
        source = "the model config given"
    check_shape(model_config, source)
    check_context(cfg, model_config, source)
    _check_genrm(cfg)
    from reasonrl_fast.layout import refuse_packing, refuse_sequence_parallel, tensor_parallel

    tensor_parallel(cfg, model_config)  # the rollout's tensor-parallel size against the heads
    refuse_packing(cfg.data.packing, model_config)  # data.packing=true where the attention cannot read packed rows
    refuse_sequence_parallel(cfg, model_config)  # the update's sequence parallel against the heads and packing
    if files:
        from reasonrl_fast.runtime.ray_cluster import check_local_nodes

        check_local_nodes(cfg)  # a local instance is one node
        _check_split_devices(cfg)
        _check_files(cfg)
        if not cfg.embedded_model:  # weights the workers could load (the embedded model gets its own)
            from reasonrl_fast.models.loading import check_weights

            check_weights(cfg.model.path)
        vocab = _tokenizer_length(cfg)
        if vocab is not None:
            check_shape(model_config, source, vocab)
    # The model built on the meta device: a class the trainer cannot train (no decoder or output
    # layer it can find), and with model.fused_lm_head=true a head it cannot fuse.
    from reasonrl_fast.models.lm_head import check_model

    check_model(cfg.model.fused_lm_head, model_config)
    if cfg.rollout.kv_cache_memory_bytes is not None:  # an engine given bytes, not a share of the device
        _check_kv_budget(cfg, model_config, source, files)
    for spec in cfg.rollout.tools:  # a tool that cannot be imported or has no schema, named now
        from reasonrl_fast.tools import load_tool

        load_tool(spec)
    if cfg.optim.bf16_stochastic_round:  # torchao is an extra of its own: missing, say so now
        from reasonrl_fast.trainer.optim import stochastic_adamw

        stochastic_adamw()
    if files:  # the rollout engine: not installed, or cannot load this architecture
        from reasonrl_fast.rollout import get_rollout

        get_rollout(cfg.rollout.backend).preflight(model_config.architectures)
    return model_config


def _check_split_devices(cfg) -> None:
    """Split placement on a local instance with GPUs: the rollout engines' workers beside the
    trainer's, a GPU each, on this node's GPUs (a cluster's are counted when its workers are
    placed: trainer/cluster.py `check_rollout_fits`)."""
    from reasonrl_fast.runtime.ray_cluster import ray_address

    if cfg.trainer.placement != "split" or ray_address(cfg):
        return
    import torch

    gpus = torch.cuda.device_count()
    t, r = cfg.trainer, cfg.rollout
    rollout, trainer = r.workers * r.tensor_parallel_size, t.nnodes * t.workers_per_node
    if gpus and rollout + trainer > gpus:
        raise ConfigError(f"rollout.workers={r.workers} x rollout.tensor_parallel_size={r.tensor_parallel_size} "
                          f"rollout workers beside {trainer} trainer workers need {rollout + trainer} GPUs with "
                          f"trainer.placement=split; this node has {gpus}")


def _policy_config(cfg):
    """(the policy's config, where it was read, for messages)."""
    if cfg.embedded_model:
        from reasonrl_fast.models.tiny import TINY_SOURCE, tiny_config

        return tiny_config(cfg.model), TINY_SOURCE
    from reasonrl_fast.models.loading import load_model_config

    return load_model_config(cfg.model.path), f"config.json of model.path={cfg.model.path!r}"


def _check_kv_budget(cfg, model_config, source: str, here: bool) -> None:
    """The planner's check (plan.py `kv_budget_problem`): a KV cache too small for one full-length
    sequence, with which vLLM would not start. On the workers' device: this machine's (`here`),
    else a recipe's GPU cluster, whose engine caches in bf16."""
    from reasonrl_fast.layout.shape import shape_from_config
    from reasonrl_fast.plan import kv_budget_problem, plan_layout

    device = "gpu"
    if here:
        import torch

        device = "gpu" if torch.cuda.is_available() else "cpu"
    s = shape_from_config(model_config.to_dict(), source)
    problem = kv_budget_problem(cfg, s, plan_layout(cfg, s, device))
    if problem:
        raise ConfigError(problem)


def _check_genrm(cfg) -> None:
    """FAPO with a GenRM server the run starts itself on a model (`fapo.genrm.serve=hf:PATH`): a
    verdict request must fit that model's context. Only where the model's config.json can be read
    here; the server itself reports a model it cannot load, when it starts."""
    g = cfg.fapo.genrm
    model = g.local_model
    if not get_algo(cfg.algo).uses_genrm or model is None:
        return
    try:
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return
    if isinstance(config, dict):
        problem = genrm_context_problem(cfg, config, f"config.json of fapo.genrm.serve={g.serve!r}")
        if problem:
            raise ConfigError(problem)


def _check_files(cfg) -> None:
    """The data files, the reward function and the run directory: each a glance, so that a bad
    one fails now, not after the warm start and the trainer's imports."""
    from reasonrl_fast.data.records import check_files
    from reasonrl_fast.rewards.score import load_reward_fn
    from reasonrl_fast.runtime.checkpoint import make_run_dir

    check_files(cfg.data.train_files, "data.train_files")
    check_files(cfg.data.val_files, "data.val_files")
    for i, v in enumerate(cfg.data.val_sets):
        check_files(v.files, f"data.val_sets[{i}].files")
    load_reward_fn(cfg.data.reward_fn)
    make_run_dir(cfg.trainer.output_dir)


def _tokenizer_length(cfg) -> int | None:
    """The length of model.path's tokenizer, where the directory has one (None for the embedded
    model, whose config is built from its tokenizer)."""
    path = cfg.model.path
    if not path or not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from reasonrl_fast.models.loading import load_tokenizer

    return len(load_tokenizer(path))
