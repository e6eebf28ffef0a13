"""Policy losses as pure functions of tensors (docs/math.md). The log-probs come from
`token_logprob`, advantages from `group_advantage`, the TB loss from `tb_loss`."""

from __future__ import annotations

import torch

from reasonrl_fast.ops import group_advantage, tb_loss


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO overlong shaping: min(-(L - (L_max - L_buf)) / L_buf * factor, 0) per response."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    over = lengths.float() - (max_len - buffer)
    return torch.clamp(-over / buffer * factor, max=0.0)


def fapo_rewards(acc: list[bool], flagged: list[bool], penalty: float) -> torch.Tensor:
    """FAPO's reward (docs/math.md §FAPO rewards): +1 right, -1 wrong, and 1 - penalty for a
    right answer the GenRM flags as flawed (0 with the default penalty 1)."""
    r = [(1.0 - penalty * f) if a else -1.0 for a, f in zip(acc, flagged, strict=True)]
    return torch.tensor(r, dtype=torch.float32)


def advantages(rewards: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool = True) -> torch.Tensor:
    """Group-normalised advantage per response (GRPO's A and FlowRL's r-hat)."""
    return group_advantage(rewards.float(), group_ids, eps=1e-6, norm_by_std=norm_by_std)


def aggregate(loss_tok: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """token-mean: over all tokens of the mini-batch; seq-mean-token-mean: per-sequence mean, then
    mean over sequences; seq-mean-token-sum: per-sequence sum, then mean over sequences."""
    m = mask.to(loss_tok.dtype)
    if mode == "token-mean":
        return (loss_tok * m).sum() / m.sum().clamp(min=1.0)
    per_seq = (loss_tok * m).sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(-1).clamp(min=1.0)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {mode!r}")
    return per_seq.mean()


def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) per token: exp(ref - lp) - (ref - lp) - 1 (>= 0)."""
    d = (ref_logprob - logprob).clamp(-20, 20)
    return torch.exp(d) - d - 1


def grpo_loss(logprob, old_logprob, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean",
              ref_logprob=None, kl_coef=0.0):
    """Clipped surrogate with clip-higher (docs/math.md §GRPO and DAPO policy loss).
    logprob/old/mask [B, T], adv [B].
    Returns (loss, stats)."""
    ratio = torch.exp(logprob - old_logprob)
    a = adv.unsqueeze(-1).to(logprob.dtype)
    clipped_obj = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a
    surr = torch.minimum(ratio * a, clipped_obj)
    loss_tok = -surr
    if kl_coef and ref_logprob is not None:
        loss_tok = loss_tok + kl_coef * kl_k3(logprob, ref_logprob)
    loss = aggregate(loss_tok, mask, agg)
    with torch.no_grad():
        m = mask.float()
        clipped = (clipped_obj < ratio * a).float()  # tokens where the clip is active (no gradient)
        stats = {"grpo/clip_frac": float((clipped * m).sum() / m.sum().clamp(min=1))}
        if ref_logprob is not None:
            stats["kl/mean"] = float((kl_k3(logprob, ref_logprob) * m).sum() / m.sum().clamp(min=1))
    return loss, stats


def flowrl_loss(log_z, logprob, ref_logprob, old_logprob, adv, mask, beta=15.0, max_is_weight=10.0,
                is_clip_eps=None):
    """FlowRL trajectory balance (docs/math.md §FlowRL trajectory balance) through the fused
    `tb_loss`. Returns (loss, stats)."""
    loss, st = tb_loss(log_z, logprob, ref_logprob, old_logprob, adv.float(), mask.to(logprob.dtype),
                       beta=beta, max_is_weight=max_is_weight, is_clip_eps=is_clip_eps, return_stats=True)
    stats = {"log_z/mean": float(log_z.detach().float().mean()),
             "tb/delta_abs_mean": float(st["delta"].abs().mean()),
             "tb/is_weight_mean": float(st["is_weight"].mean())}
    return loss, stats
