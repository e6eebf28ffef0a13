"""Generation engines behind one interface (base.py): `hf` (a Hugging Face model sampled with its
KV cache, hf.py: everywhere) and `vllm` (a colocated vLLM engine, vllm.py: GPU or CPU). Used by
the trainer's workers and the eval command; both give each sample its own seed and report the
sampler's log-prob of every token."""

from __future__ import annotations

import torch

from reasonrl_fast.rollout.base import RolloutEngine, Samples, sample_seed, sample_seeds
from reasonrl_fast.rollout.hf import HFRollout

__all__ = ["HFRollout", "RolloutEngine", "Samples", "make_rollout", "sample_seed", "sample_seeds"]


def make_rollout(cfg, lm, model_path: str, pad_id: int, eos_id: int, device, dtype: torch.dtype,
                 log_path: str | None = None, log=print) -> RolloutEngine:
    """The engine `cfg.rollout.backend` names, sampling in `dtype` (the trainer's compute dtype,
    trainer/fsdp.py `compute_dtype`): hf copies `lm` in it (loaded with the run's context); vllm
    loads `model_path` itself with model.max_position_embeddings applied (its log to `log_path`),
    in bf16 on a GPU whatever `dtype` (its kernels are made for it)."""
    r = cfg.rollout
    if r.backend == "vllm":
        from reasonrl_fast.rollout.vllm import VLLMRollout

        cuda = torch.device(device).type == "cuda"
        return VLLMRollout(model_path, torch.bfloat16 if cuda else dtype, eos_id,
                           cfg.data.max_prompt_length + r.max_new_tokens, cfg.trainer.seed,
                           device, r.gpu_memory_utilization, log_path, log, cfg.model.max_position_embeddings)
    return HFRollout(lm, pad_id, eos_id, device, r.decoder, dtype)
