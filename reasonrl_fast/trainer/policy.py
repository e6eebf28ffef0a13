"""The trained module: the causal LM plus (FlowRL) the Z-head, under one root so FSDP2 shards
and gathers them together, and the batch layout that turns (prompt, response) id lists into
tensors. Log-probs and entropies come from the fused `token_logprob` op."""

from __future__ import annotations

import torch
from torch import nn

from reasonrl_fast.ops import ZHead, token_logprob


class Actor(nn.Module):
    """`lm` is a Hugging Face causal LM; `proj_z` (FlowRL) is attached before sharding so the
    same optimiser trains it and the TB loss reaches the backbone through log Z
    (docs/math.md §Z-head)."""

    def __init__(self, lm: nn.Module, zhead_layers: int = 0):
        super().__init__()
        self.lm = lm
        self.proj_z = ZHead(lm.config.hidden_size, num_layers=zhead_layers) if zhead_layers else None

    def forward(self, batch: dict, temperature: float = 1.0, entropy: bool = False, log_z: bool = False):
        """Returns (logprob [B, R], entropy [B, R] or None, log_z [B] or None) for the response
        tokens of `batch` (see `make_batch`)."""
        out = self.lm.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"], use_cache=False)
        h = out.last_hidden_state
        p = batch["prompt_len"]
        # Only the positions that predict response tokens go through the LM head.
        logits = self.lm.lm_head(h[:, p - 1:-1])
        res = token_logprob(logits, batch["targets"], temperature=temperature, return_entropy=entropy)
        lp, ent = (res if entropy else (res, None))
        z = self.proj_z(h, batch["prompt_mask"]) if (log_z and self.proj_z is not None) else None
        return lp, ent, z


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device) -> dict:
    """[left-padded prompt | right-padded response]; `targets` are the response ids with -100 on
    padding, `response_mask` marks real response tokens, `prompt_mask` real prompt tokens."""
    b = len(prompts)
    p = max(len(x) for x in prompts)
    r = max(1, max(len(x) for x in responses))
    ids = torch.full((b, p + r), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    targets = torch.full((b, r), -100, dtype=torch.long)
    for i, (pr, rs) in enumerate(zip(prompts, responses)):
        ids[i, p - len(pr):p] = torch.tensor(pr)
        attn[i, p - len(pr):p] = 1
        if rs:
            ids[i, p:p + len(rs)] = torch.tensor(rs)
            attn[i, p:p + len(rs)] = 1
            targets[i, :len(rs)] = torch.tensor(rs)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    prompt_mask = attn.clone()
    prompt_mask[:, p:] = 0
    batch = {"input_ids": ids, "attention_mask": attn, "position_ids": position_ids,
             "targets": targets, "response_mask": (targets != -100).float(), "prompt_mask": prompt_mask}
    batch = {k: v.to(device) for k, v in batch.items()}
    batch["prompt_len"] = p
    return batch


def slice_batch(batch: dict, idx) -> dict:
    return {k: (v[idx] if torch.is_tensor(v) else v) for k, v in batch.items()}
