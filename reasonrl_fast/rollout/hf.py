"""The `hf` engine: the policy's Hugging Face model sampled with its KV cache by the project's own
loop (rollout/sampling.py `sample`), on an unsharded copy of the policy's weights refreshed after
every sync. Works on every device and model.

`HF` is what the registry (rollout/registry.py) knows of the engine, answered without torch (this
module imports torch only when an engine is built); `HFEngine` samples."""

from __future__ import annotations

from reasonrl_fast.layout import dtype_bytes
from reasonrl_fast.rollout.base import Engine, Samples
from reasonrl_fast.rollout.registry import EngineMemory, EngineSpec, MemoryTerm, engine_device
from reasonrl_fast.util import rollout_sequences

SAMPLER_BYTES_PER_LOGIT = 40
"""What the sampler holds per row and vocabulary entry beside the cache: the float32 logits, the
float64 noise and the int64 hashes it is drawn from (rollout/sampling.py)."""


class HFEngine(Engine):
    """`decoder`: "auto" samples a Llama-family model with the lean decoder (rollout/lean.py)
    and any other through its forward; "model" always through its forward. `dtype`: the copy's
    dtype (default `lm`'s own); the weight sync casts into it."""

    def __init__(self, lm, pad_id: int, eos_id: int, device, decoder: str = "auto", dtype=None):
        import copy

        from reasonrl_fast.rollout.lean import LeanDecoder, unsupported

        if decoder not in ("auto", "model"):
            raise ValueError(f"HFEngine: decoder={decoder!r}, expected 'auto' or 'model'")
        self.model = copy.deepcopy(lm).to(device=device, dtype=dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.pad_id, self.eos_id, self.device = pad_id, eos_id, device
        self.lean = LeanDecoder(self.model) if decoder == "auto" and unsupported(self.model) is None else None
        self.params = dict(self.model.named_parameters())  # after the lean decoder's fusing

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seeds, between_tokens=None, stop=None):
        import torch

        from reasonrl_fast.rollout.sampling import sample

        if not prompts:
            return Samples()
        rep = [p for p in prompts for _ in range(n)]
        if len(seeds) != len(rep):
            raise ValueError(f"HFEngine.generate: {len(seeds)} seeds for {len(rep)} samples")
        per_row = isinstance(max_new_tokens, (list, tuple))
        limits = [m for m in max_new_tokens for _ in range(n)] if per_row else [max_new_tokens] * len(rep)
        width = max(len(p) for p in rep)
        ids = torch.full((len(rep), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(rep):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        with torch.no_grad():
            out, lps = sample(self.model, ids.to(self.device), attn.to(self.device), temperature, top_p,
                              torch.tensor(limits) if per_row else max_new_tokens, self.eos_id, self.pad_id,
                              self.lean, torch.tensor(seeds), between_tokens, stop)
        res = Samples()
        for row, lp, limit in zip(out.tolist(), lps.tolist(), limits):
            end = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)  # keep EOS: the policy learns to stop
            end = min(end, limit)  # a row cut at its own limit is padded after it
            if stop is not None and stop.ends[len(res.tokens)] is not None:  # ended by a stop string
                end = min(end, stop.ends[len(res.tokens)])
            res.tokens.append(row[:end])
            res.logprobs.append(lp[:end])
        return res

    def load_weights(self, named_tensors):
        import torch

        with torch.no_grad():
            for name, t in named_tensors:
                self.params[name].copy_(t)


class HF(EngineSpec):
    """The `hf` engine's facts (rollout/registry.py `EngineSpec`)."""

    name = "hf"
    label = "hf"
    needs_trainer_copy = True
    weights_between_tokens = True

    def memory(self, cfg, shape, layout, device_bytes):
        # a full copy of the weights beside the trainer's, and a KV cache as long as its batch,
        # every row at its longest (the sampler's DynamicCache, or the lean decoder's)
        s, batch = shape, rollout_sequences(cfg)
        seq = cfg.max_sequence
        eb = dtype_bytes(layout.rollout_dtype)
        weights = s.params * eb
        cache = (2 * s.layers * batch * s.kv_heads * s.head_dim * seq * eb
                 + batch * s.vocab * SAMPLER_BYTES_PER_LOGIT)
        name = self.label or self.name
        return EngineMemory([
            MemoryTerm(f"{name} rollout copy", weights, weights,
                       f"full weights in {layout.rollout_dtype}, refreshed every sync", ""),
            MemoryTerm(f"{name} rollout KV cache", cache, 0, f"{batch} rows x {seq} tokens")])

    def build(self, cfg, layout, lm, model_path, tok, log=print, *, device=None, log_path=None):
        import torch

        return HFEngine(lm, tok.pad_token_id, tok.eos_token_id, engine_device(layout, device), cfg.rollout.decoder,
                        getattr(torch, layout.rollout_dtype))


__all__ = ["HF", "HFEngine"]
