"""Plain-PyTorch references for every op: the definitions the kernels are tested against.

Written for clarity, straight from docs/math.md; they materialise everything and run in whatever
dtype they are given (tests pass float64).
"""

from __future__ import annotations

import torch


def token_logprob(logits, token_ids, temperature=1.0, ignore_index=-100):
    """(logprob, entropy) of softmax(logits / temperature), 0 at ignored positions."""
    s = logits / temperature
    logp = torch.log_softmax(s, dim=-1)
    valid = token_ids != ignore_index
    safe = torch.where(valid, token_ids, torch.zeros_like(token_ids))
    lp = logp.gather(-1, safe.unsqueeze(-1).long()).squeeze(-1)
    p = logp.exp()
    # 0 * log 0 = 0: masked-out (-inf) logits contribute nothing to the entropy.
    ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
    zero = torch.zeros_like(lp)
    return torch.where(valid, lp, zero), torch.where(valid, ent, zero)


def group_advantage(rewards, group_ids, eps=1e-6, norm_by_std=True):
    """verl's loop over groups (its compute_grpo_outcome_advantage)."""
    out = torch.empty_like(rewards)
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero(as_tuple=True)[0]
        r = rewards[idx]
        if r.numel() == 1:
            mean, std = torch.zeros_like(r[0]), torch.ones_like(r[0])
        else:
            mean, std = r.mean(), r.std()
        out[idx] = (r - mean) / (std + eps) if norm_by_std else r - mean
    return out


def tb_loss(log_z, logprob, ref_logprob, old_logprob, reward, mask, beta=15.0,
            min_is_weight=0.0, max_is_weight=10.0):
    """(loss, delta, is_weight) of the trajectory-balance loss."""
    mask = mask.to(logprob.dtype)
    n = mask.sum(-1)
    avg_lp = (logprob * mask).sum(-1) / (n + 1e-8)
    avg_ref = (ref_logprob * mask).sum(-1) / (n + 1e-8)
    delta = log_z + avg_lp - beta * reward - avg_ref
    w = torch.exp(((logprob - old_logprob) * mask).sum(-1)).clamp(min_is_weight, max_is_weight).detach()
    return (w * delta**2).mean(), delta, w


def masked_mean(x, mask):
    """sum_t x m / sum_t m; 0 (and no gradient) where sum_t m == 0, e.g. weights [1, -1]."""
    mask = mask.to(x.dtype)
    n = mask.sum(-1, keepdim=True)
    empty = n == 0
    out = (x * mask.unsqueeze(-1)).sum(1) / torch.where(empty, torch.ones_like(n), n)
    return torch.where(empty, torch.zeros_like(out), out)
