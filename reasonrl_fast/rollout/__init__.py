"""Generation engines behind one interface (base.py), by name (registry.py `ROLLOUTS`): `hf` (a
Hugging Face model sampled with its KV cache, hf.py: everywhere) and `vllm` (a colocated vLLM
engine, vllm.py: GPU or CPU). Used by the trainer's workers and the eval command; every engine
gives each sample its own seed and reports the sampler's log-prob of every token.

Importing the package loads neither torch nor an engine: the registry's facts are asked on
machines without them (the planner, the config checks), and an engine is imported when built."""

from __future__ import annotations

from reasonrl_fast.rollout.base import RolloutEngine, Samples, sample_seed, sample_seeds
from reasonrl_fast.rollout.registry import ROLLOUTS, Rollout, get_rollout

__all__ = ["ROLLOUTS", "Rollout", "RolloutEngine", "Samples", "get_rollout", "make_rollout", "sample_seed",
           "sample_seeds"]


def make_rollout(cfg, layout, lm, model_path: str, pad_id: int, eos_id: int, device, log_path: str | None = None,
                 log=print, rollout: Rollout | None = None) -> RolloutEngine:
    """The engine `rollout` (default: the one `cfg.rollout.backend` names) as the run's Layout
    (layout/resolve.py `resolve`) has it: sampling in `layout.rollout_dtype` on `device`, its KV
    cache `layout.kv_cache_bytes` (or its share of the GPU). `lm`, the policy's Hugging Face model,
    goes to an engine that `needs_trainer_copy` (None: the engine loads `model_path` itself)."""
    import torch

    rollout = rollout or get_rollout(cfg.rollout.backend)
    return rollout.build(cfg, lm if rollout.needs_trainer_copy else None, model_path, pad_id, eos_id,
                         torch.device(device), getattr(torch, layout.rollout_dtype), layout.kv_cache_bytes,
                         log_path, log)
