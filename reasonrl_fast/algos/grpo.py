"""GRPO with DAPO's clip-higher and loss aggregations (docs/math.md §GRPO and DAPO policy loss)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reasonrl_fast.algos.base import Algo

if TYPE_CHECKING:
    import torch


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
    import torch

    d = (ref_logprob - logprob).clamp(-20, 20)
    return torch.exp(d) - d - 1


# Bound of the log-ratio lp - lp_old before exp, as verl's policy losses clamp it: a token the
# policy has moved far from since the rollout (a stale one, late in a step's mini-batches) would
# otherwise overflow exp to inf, and inf * 0 (a clipped branch, a masked token) is NaN. Inside
# the bound nothing changes: exp(20) ~ 4.9e8 is far past any clip.
LOG_RATIO_BOUND = 20.0


def grpo_loss(logprob, old_logprob, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean",
              ref_logprob=None, kl_coef=0.0, rollout_weight=None, clip_ratio_c=None):
    """Clipped surrogate with clip-higher. logprob/old/mask [B, T], adv [B]; `rollout_weight`
    ([B, T] or [B], detached): the rollout correction, multiplied into the policy-gradient term
    (not the KL term); `clip_ratio_c` (> 1, or None: off): the dual clip, which bounds a token's
    loss at -A * clip_ratio_c where A < 0 (verl's compute_policy_loss_vanilla, after Ye et al.
    2020, arXiv:1912.09729). Returns (loss, stats)."""
    import torch

    ratio = torch.exp((logprob - old_logprob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    a = adv.unsqueeze(-1).to(logprob.dtype)
    clipped_obj = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a
    surr = torch.minimum(ratio * a, clipped_obj)
    dual = None
    if clip_ratio_c is not None:
        # For A < 0 the clipped surrogate still grows with the ratio without bound (the clip
        # only stops ratios below 1 - eps_low), so one token the policy has already made much
        # likelier can dominate the mini-batch; its loss -surr is capped at -A * c, a constant
        # there (no gradient). Applied before the rollout weight, as verl does.
        floor = a * clip_ratio_c
        dual = (a < 0) & (surr < floor)
        surr = torch.where(dual, floor, surr)
    if rollout_weight is not None:
        w = rollout_weight if rollout_weight.dim() == 2 else rollout_weight.unsqueeze(-1)
        surr = surr * w.to(surr.dtype)
    loss_tok = -surr
    if kl_coef and ref_logprob is not None:
        loss_tok = loss_tok + kl_coef * kl_k3(logprob, ref_logprob)
    loss = aggregate(loss_tok, mask, agg)
    with torch.no_grad():
        m = mask.float()
        clipped = (clipped_obj < ratio * a).float()  # tokens where the clip is active (no gradient)
        stats = {"grpo/clip_frac": float((clipped * m).sum() / m.sum().clamp(min=1))}
        if dual is not None:  # verl's pg_clipfrac_lower: the tokens where the dual clip binds
            stats["grpo/dual_clip_frac"] = float((dual.float() * m).sum() / m.sum().clamp(min=1))
        if ref_logprob is not None:
            stats["kl/mean"] = float((kl_k3(logprob, ref_logprob) * m).sum() / m.sum().clamp(min=1))
    return loss, stats


class GRPO(Algo):
    name = "grpo"

    def needs_ref(self, cfg) -> bool:  # the k3 KL term reads the reference log-probs
        return cfg.grpo.kl_coef > 0

    def overlong(self, cfg) -> tuple[int, float]:
        return cfg.grpo.overlong_buffer, cfg.grpo.overlong_factor

    def norm_by_std(self, cfg) -> bool:
        return cfg.grpo.norm_by_std

    def loss_units(self, cfg) -> str:
        return "tokens" if cfg.grpo.loss_agg == "token-mean" else "sequences"

    def loss(self, cfg, lp, old_lp, ref_lp, adv, mask, log_z, rollout_w=None):
        g = cfg.grpo
        return grpo_loss(lp, old_lp, adv, mask, g.clip_low, g.clip_high, g.loss_agg, ref_lp, g.kl_coef, rollout_w,
                         g.clip_ratio_c)
