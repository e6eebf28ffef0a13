"""The rollout's distance from the trainer, and the truncated importance weights that correct for
it (docs/math.md §Rollout correction). Pure functions of [B, T] tensors.

d[b, t] = lp_old[b, t] - lp_rollout[b, t]: the trainer's log-prob of a sampled token under the
weights it sampled with (lp_old) minus the sampler's own. Zero in exact arithmetic when the
engine holds the trainer's weights; in practice the kernels differ (bf16, another attention,
another matmul order), and a stale engine (rollout.sync_every > 1) differs by the updates it
missed."""

from __future__ import annotations

import math

import torch

MODES = ("none", "token_tis", "seq_tis")


def gap_sums(old_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Sums over the response tokens, to be pooled over mini-batches and workers before dividing:
    |d|, k3 = exp(d) - d - 1 (an estimate of KL(rollout || trainer) per token, >= 0), the token
    count, and the largest |d|."""
    m = mask.double()  # float64: k3 of a gap near 1e-7 is 1e-14, below float32's rounding of exp
    d = (old_lp.double() - rollout_lp.double()) * m
    dc = d.clamp(-20, 20)  # k3 of a wild token stays finite
    return {"abs": float(d.abs().sum()), "k3": float(((dc.exp() - dc - 1) * m).sum()),
            "tokens": float(m.sum()), "max": float(d.abs().max()) if d.numel() else 0.0}


def rollout_weights(old_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor, mode: str, cap: float,
                    per_sequence: bool = False) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Truncated importance weights of the trainer's policy over the sampler's (detached), and
    sums for their statistics ({"weight", "clipped", "count"}: pooled like `gap_sums`).

    token_tis: w[b, t] = min(exp(d[b, t]), cap), [B, T] (1 on padding).
    seq_tis:   w[b] = min(exp(sum_t d[b, t]), cap), [B].
    `per_sequence` (a loss over whole trajectories, FlowRL): one weight per response either way;
    token_tis then gives min(prod_t min(exp(d[b, t]), cap), cap).
    None for mode "none"."""
    if mode not in MODES:
        raise ValueError(f"rollout correction {mode!r}: expected one of {MODES}")
    if mode == "none":
        return None, {}
    m = mask.float()
    d = (old_lp.float() - rollout_lp.float()).detach() * m
    log_cap = math.log(cap)
    if mode == "token_tis":
        clipped = (d > log_cap).float() * m
        log_w = d.clamp(max=log_cap)  # min(exp(d), cap) without overflowing exp
        if not per_sequence:
            w = log_w.exp() * m + (1 - m)
            return w, {"weight": float((w * m).sum()), "clipped": float(clipped.sum()), "count": float(m.sum())}
        seq = log_w.sum(-1)
    else:
        seq = d.sum(-1)
    w = seq.clamp(max=log_cap).exp()
    return w, {"weight": float(w.sum()), "clipped": float((seq > log_cap).float().sum()), "count": float(w.numel())}


def pool_sums(parts) -> dict[str, float]:
    """`gap_sums` / `rollout_weights` sums of several mini-batches or workers as one: added, but
    the largest gap ("max") taken."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = max(out.get(k, 0.0), v) if k == "max" else out.get(k, 0.0) + v
    return out


def rollout_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The step's rollout/* metrics from the pooled sums (the weights' under a "w_" prefix)."""
    n = max(sums.get("tokens", 0.0), 1.0)
    out = {"rollout/logprob_diff_mean": sums.get("abs", 0.0) / n, "rollout/logprob_diff_max": sums.get("max", 0.0),
           "rollout/kl_k3": sums.get("k3", 0.0) / n}
    if "w_count" in sums:
        c = max(sums["w_count"], 1.0)
        out.update({"rollout/is_weight_mean": sums["w_weight"] / c, "rollout/is_clipped_frac": sums["w_clipped"] / c})
    return out
