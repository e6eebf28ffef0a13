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
                 log_path: str | None = None, log=print, sequences: int | None = None) -> RolloutEngine:
    """The engine `cfg.rollout.backend` names, sampling in `dtype` (the trainer's compute dtype,
    trainer/fsdp.py `compute_dtype`): hf copies `lm` in it (loaded with the run's context); vllm
    loads `model_path` itself with model.max_position_embeddings applied (its log to `log_path`),
    in bf16 on a GPU whatever `dtype` (its kernels are made for it), its KV cache sized for
    `sequences` at once (default: a trainer worker's rollout batch; vllm.py `kv_cache_bytes`)."""
    r = cfg.rollout
    if r.backend == "vllm":
        from reasonrl_fast.models.shape import model_fields
        from reasonrl_fast.rollout.vllm import VLLMRollout, kv_cache_bytes, kv_shape

        cuda = torch.device(device).type == "cuda"
        engine_dtype = torch.bfloat16 if cuda else dtype
        kv_bytes = None  # a GPU engine: its share of the device unless a size is set
        if not cuda or r.kv_cache_memory_bytes is not None:
            config = model_fields(model_path, f"the rollout's model {model_path!r}")[0]
            kv_bytes = kv_cache_bytes(cfg, kv_shape(config), engine_dtype.itemsize, sequences)
        if not cuda and r.gpu_memory_utilization is not None:
            log(f"rollout.gpu_memory_utilization={r.gpu_memory_utilization:g} applies on a GPU only: vLLM on CPU "
                f"keeps a KV cache of {kv_bytes} bytes (rollout.kv_cache_memory_bytes)")
        return VLLMRollout(model_path, engine_dtype, eos_id,
                           cfg.data.max_prompt_length + r.max_new_tokens, cfg.trainer.seed,
                           device, r.gpu_memory_utilization, log_path, log, cfg.model.max_position_embeddings,
                           kv_bytes)
    return HFRollout(lm, pad_id, eos_id, device, r.decoder, dtype)
