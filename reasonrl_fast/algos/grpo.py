"""GRPO with DAPO's clip-higher and loss aggregations, and the policy losses GSPO and CISPO
(docs/math.md §GRPO and DAPO policy loss, §GSPO and CISPO)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from reasonrl_fast.algos.base import Algo
from reasonrl_fast.config.checks import Checks, fail

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


# GSPO's bound of the token-form log sequence ratio before exp (verl's compute_policy_loss_gspo
# clamps it at 10 from above; a sequence's ratio is a mean over its tokens, so it stays far below).
LOG_SEQ_RATIO_BOUND = 10.0

POLICY_LOSSES = ("clip", "gspo", "cispo")


def _ratio(logprob, old_logprob):
    """exp of the log-ratio, bounded (LOG_RATIO_BOUND)."""
    import torch

    return torch.exp((logprob - old_logprob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def clip_terms(logprob, old_logprob, a, clip_low, clip_high, clip_ratio_c=None):
    """PPO's clipped token ratio with clip-higher, and the dual clip (`clip_ratio_c` > 1, or None:
    off), which bounds a token's loss at -A * clip_ratio_c where A < 0 (verl's
    compute_policy_loss_vanilla, after Ye et al. 2020, arXiv:1912.09729). Returns (the per-token
    loss before weights, the tokens where the clip stops the gradient, those where the dual clip
    binds or None)."""
    import torch

    ratio = _ratio(logprob, old_logprob)
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
    return -surr, clipped_obj < ratio * a, dual


def gspo_terms(logprob, old_logprob, a, mask, clip_low, clip_high):
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): the sequence ratio s = exp(mean_t (lp - lp_old))
    in the token form s_t = sg[s] * pi(y_t) / sg[pi(y_t)], clipped as PPO clips a token's.
    Returns (the per-token loss before weights, the tokens whose clipped branch is the larger)."""
    import torch

    m = mask.to(logprob.dtype)
    seq = ((logprob - old_logprob) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    s = torch.exp((logprob - logprob.detach() + seq.detach().unsqueeze(-1)).clamp(max=LOG_SEQ_RATIO_BOUND))
    unclipped, clipped = -a * s, -a * torch.clamp(s, 1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def cispo_terms(logprob, old_logprob, a, clip_low, clip_high):
    """CISPO (MiniMax-M1, arXiv:2506.13585): every token keeps its gradient, weighted by its
    importance ratio clipped and detached: -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * lp.
    Returns (the per-token loss before weights, the tokens whose ratio the clip changed)."""
    import torch

    ratio = _ratio(logprob, old_logprob)
    w = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).detach()
    return -w * a * logprob, ratio != w


def grpo_loss(logprob, old_logprob, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean",
              ref_logprob=None, kl_coef=0.0, rollout_weight=None, clip_ratio_c=None, policy_loss="clip",
              entropy=None, entropy_coef=0.0):
    """GRPO's loss. logprob/old/mask [B, T], adv [B]; `policy_loss`: clip (`clip_terms`, with the
    dual clip `clip_ratio_c`), gspo (`gspo_terms`) or cispo (`cispo_terms`); `rollout_weight`
    ([B, T] or [B], detached): the rollout correction, multiplied into the policy-gradient term
    (not the KL term, nor the entropy bonus); `entropy` [B, T] (with its gradient): the policy's
    entropy per token, whose aggregate times `entropy_coef` is subtracted. Returns (loss, stats)."""
    a = adv.unsqueeze(-1).to(logprob.dtype)
    dual = None
    if policy_loss == "clip":
        pg, clipped, dual = clip_terms(logprob, old_logprob, a, clip_low, clip_high, clip_ratio_c)
    elif clip_ratio_c is not None:
        raise ValueError(f"the dual clip (clip_ratio_c) belongs to policy_loss='clip', not {policy_loss!r}")
    elif policy_loss == "gspo":
        pg, clipped = gspo_terms(logprob, old_logprob, a, mask, clip_low, clip_high)
    elif policy_loss == "cispo":
        pg, clipped = cispo_terms(logprob, old_logprob, a, clip_low, clip_high)
    else:
        raise ValueError(f"unknown policy loss {policy_loss!r}: one of {POLICY_LOSSES}")
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef > 0 needs the policy's per-token entropy (entropy=...)")
    bonus = entropy_coef * entropy if entropy_coef else None
    return _finish(pg, clipped, dual, logprob, mask, agg, ref_logprob, kl_coef, rollout_weight, bonus)


def _finish(pg, clipped, dual, logprob, mask, agg, ref_logprob, kl_coef, rollout_weight, bonus=None):
    """Every policy loss's tail: the per-token loss `pg` times the rollout weight, plus the KL
    term, minus the entropy bonus (`bonus`: coef x entropy per token, or None), aggregated alike
    (verl aggregates the three apart in the same mode; the aggregation is linear, so the sum is
    the same); the statistics (`clipped`: the tokens each loss counts as clipped; `dual`: the dual
    clip's, or None)."""
    import torch

    if rollout_weight is not None:
        w = rollout_weight if rollout_weight.dim() == 2 else rollout_weight.unsqueeze(-1)
        pg = pg * w.to(pg.dtype)
    loss_tok = pg
    if kl_coef and ref_logprob is not None:
        loss_tok = loss_tok + kl_coef * kl_k3(logprob, ref_logprob)
    if bonus is not None:
        loss_tok = loss_tok - bonus.to(loss_tok.dtype)
    loss = aggregate(loss_tok, mask, agg)
    with torch.no_grad():
        m = mask.float()
        stats = {"grpo/clip_frac": float((clipped.float() * m).sum() / m.sum().clamp(min=1))}
        if dual is not None:  # verl's pg_clipfrac_lower: the tokens where the dual clip binds
            stats["grpo/dual_clip_frac"] = float((dual.float() * m).sum() / m.sum().clamp(min=1))
        if ref_logprob is not None:
            stats["kl/mean"] = float((kl_k3(logprob, ref_logprob) * m).sum() / m.sum().clamp(min=1))
    return loss, stats


@dataclass
class GRPOConfig(Checks):
    """GRPO's settings (`grpo.*`), read by algo=grpo and by FAPO, which is GRPO with other
    rewards."""

    clip_low: float = 0.2
    """epsilon_low of the clipped surrogate."""
    clip_high: float = 0.28
    """epsilon_high (clip-higher, DAPO)."""
    loss_agg: str = "token-mean"
    """token-mean, seq-mean-token-mean or seq-mean-token-sum."""
    kl_coef: float = 0.0
    """Coefficient of the k3 KL to the reference policy (0: no reference model)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping buffer L_buf in tokens (0: off), for algo=grpo and fapo (FlowRL has
    its own, flowrl.overlong_buffer)."""
    overlong_factor: float = 1.0
    """DAPO overlong penalty factor."""
    norm_by_std: bool = True
    """Divide advantages by the group std (False: Dr.GRPO)."""
    clip_ratio_c: Optional[float] = None
    """Dual clip (verl's clip_ratio_c, 10.0 in its FAPO and baseline scripts): a token with a
    negative advantage loses at most -A * clip_ratio_c, so a stale token whose ratio has grown
    past it stops pushing (docs/math.md §GRPO and DAPO policy loss; logged as
    grpo/dual_clip_frac). Unset: off. Must be > 1."""
    policy_loss: str = "clip"
    """The policy loss (docs/math.md §GSPO and CISPO): clip (PPO's clipped token ratio, with
    clip-higher and the dual clip), gspo (the clipped sequence ratio; with
    loss_agg=seq-mean-token-mean, as its paper and verl aggregate it; its paper's clip_low and
    clip_high are 3e-4 and 4e-4) or cispo (every token's gradient kept, weighted by its clipped,
    detached ratio; clip_low=1 bounds only the upper side, as its paper does)."""
    entropy_coef: float = 0.0
    """Entropy bonus (verl's actor.entropy_coeff): the loss subtracts this times the policy's
    per-token entropy, aggregated as the loss is (loss_agg), so a positive value keeps the policy
    from collapsing onto one answer early (docs/math.md §Entropy bonus). 0: off, as in every
    shipped recipe."""

    def check(self, at: str = "grpo.") -> None:
        self._one_of(at, "loss_agg", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"))
        self._one_of(at, "policy_loss", POLICY_LOSSES)
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            fail(f"{at}clip_ratio_c", self.clip_ratio_c, "must be > 1 (it bounds ratios above 1)")
        if self.clip_ratio_c is not None and self.policy_loss != "clip":
            fail(f"{at}clip_ratio_c", self.clip_ratio_c, f"is the dual clip of policy_loss=clip, not of "
                 f"{self.policy_loss} (unset it)")
        if self.policy_loss == "gspo" and self.loss_agg != "seq-mean-token-mean":
            fail(f"{at}loss_agg", self.loss_agg, "with policy_loss=gspo must be seq-mean-token-mean (GSPO's "
                 "ratio and loss are per sequence, as its paper and verl aggregate them)")
        # the clip interval [1 - clip_low, 1 + clip_high] holds ratio 1 whenever both are > 0, and
        # clip_low = 1 already opens it down to 0: positive epsilons cannot invert it, so the two
        # need no order (clip-higher has clip_high > clip_low, the symmetric PPO clip equal ones)
        self._between(at, "clip_low", 0, 1, lo_open=True)
        self._positive(at, "clip_high")
        self._not_negative(at, "kl_coef", "overlong_buffer", "overlong_factor", "entropy_coef")


class GRPO(Algo):
    name = "grpo"
    section, Settings = "grpo", GRPOConfig
    overlong_setting = "grpo.overlong_buffer"

    def needs_ref(self, cfg) -> bool:  # the k3 KL term reads the reference log-probs
        return cfg.grpo.kl_coef > 0

    def overlong(self, cfg) -> tuple[int, float]:
        return cfg.grpo.overlong_buffer, cfg.grpo.overlong_factor

    def norm_by_std(self, cfg) -> bool:
        return cfg.grpo.norm_by_std

    def loss_units(self, cfg) -> str:
        return "tokens" if cfg.grpo.loss_agg == "token-mean" else "sequences"

    def loss(self, cfg, lp, old_lp, ref_lp, adv, mask, log_z, rollout_w=None, entropy=None):
        g = cfg.grpo
        return grpo_loss(lp, old_lp, adv, mask, g.clip_low, g.clip_high, g.loss_agg, ref_lp, g.kl_coef, rollout_w,
                         g.clip_ratio_c, g.policy_loss, entropy, g.entropy_coef)
