"""algos/correction.py and where its weights enter the losses
(docs/math.md §Rollout correction), against plain float64 definitions on fresh random inputs
with awkward sizes."""

import math

import pytest
import torch

from reasonrl_fast.algos.correction import gap_sums, pool_sums, rollout_metrics, rollout_weights
from reasonrl_fast.algos.flowrl import flowrl_loss
from reasonrl_fast.algos.grpo import grpo_loss
from reasonrl_fast.ops.reference import tb_loss as tb_reference


def batch(B=7, T=13, spread=0.5):
    old = -torch.rand(B, T, dtype=torch.float64) * 3
    roll = old - spread * torch.randn(B, T, dtype=torch.float64)
    mask = (torch.rand(B, T) > 0.3).double()
    mask[:, 0] = 1.0  # every response has a token...
    mask[3] = 0.0     # ...but one, which has none
    return old, roll, mask


def test_gap_sums():
    old, roll, mask = batch()
    d = (old - roll)[mask.bool()]
    s = gap_sums(old, roll, mask)
    assert s["tokens"] == mask.sum().item()
    assert math.isclose(s["abs"], d.abs().sum().item(), rel_tol=1e-12)
    assert math.isclose(s["max"], d.abs().max().item(), rel_tol=1e-12)
    assert math.isclose(s["k3"], (d.exp() - d - 1).sum().item(), rel_tol=1e-12)
    tiny = gap_sums(old, old + 1e-7, mask)  # a near-zero gap: k3 neither negative nor lost
    assert 0 < tiny["k3"] / tiny["tokens"] < 1e-13


# The weights are computed in float32 (docs/math.md §Rollout correction): a sequence's weight is
# exp of a sum of T float32 gaps, each |d| < ~3 and rounded a few times, so its relative error is
# up to about (T + 3) * 3 * eps32 (about 6e-6 at T = 13; 1e-6 failed once at 1.05e-6).
SEQ_RTOL = (13 + 3) * 3 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("cap", [1.0, 2.0, 5.0])
def test_weights_of_each_mode(cap):
    old, roll, mask = batch()
    d = (old - roll) * mask
    assert rollout_weights(old, roll, mask, "none", cap) == (None, {})
    w, s = rollout_weights(old, roll, mask, "token_tis", cap)
    want = torch.where(mask.bool(), d.exp().clamp(max=cap), torch.ones_like(d))
    torch.testing.assert_close(w.double(), want, rtol=1e-6, atol=0)
    assert s["count"] == mask.sum() and s["clipped"] == ((d.exp() > cap) & mask.bool()).sum()
    assert math.isclose(s["weight"], (want * mask).sum().item(), rel_tol=1e-6)

    w, s = rollout_weights(old, roll, mask, "seq_tis", cap)
    want = d.sum(-1).exp().clamp(max=cap)
    torch.testing.assert_close(w.double(), want, rtol=SEQ_RTOL, atol=0)
    assert w[3] == 1.0 and s["count"] == 7 and s["clipped"] == (d.sum(-1).exp() > cap).sum()

    w, _ = rollout_weights(old, roll, mask, "token_tis", cap, per_sequence=True)
    want = torch.where(mask.bool(), d.exp().clamp(max=cap), torch.ones_like(d)).prod(-1).clamp(max=cap)
    torch.testing.assert_close(w.double(), want, rtol=SEQ_RTOL, atol=0)


def test_huge_gaps_do_not_overflow():
    old, roll, mask = batch(spread=200.0)
    for mode in ("token_tis", "seq_tis"):
        w, s = rollout_weights(old, roll, mask, mode, 2.0)
        assert torch.isfinite(w).all() and w.max() <= 2.0 and math.isfinite(s["weight"])
    assert math.isfinite(gap_sums(old, roll, mask)["k3"])
    with pytest.raises(ValueError, match="expected one of"):
        rollout_weights(old, roll, mask, "tis", 2.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("per_token", [True, False])
def test_grpo_weight_multiplies_the_surrogate_only(agg, per_token):
    old, roll, mask = batch()
    lp = (old + 0.1 * torch.randn_like(old)).requires_grad_()
    adv, ref = torch.randn(7, dtype=torch.float64), old - 0.2
    c = (torch.rand(7, 13) * 2 if per_token else torch.rand(7) * 2).double()
    loss, _ = grpo_loss(lp, old, adv, mask, agg=agg, ref_logprob=ref, kl_coef=0.1, rollout_weight=c)
    ratio, a = (lp - old).exp(), adv[:, None]
    surr = torch.minimum(ratio * a, ratio.clamp(0.8, 1.28) * a)
    k = ref - lp
    tok = -surr * (c if per_token else c[:, None]) + 0.1 * (k.exp() - k - 1)
    if agg == "token-mean":
        want = (tok * mask).sum() / mask.sum()
    elif agg == "seq-mean-token-mean":
        want = ((tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    else:
        want = (tok * mask).sum(-1).mean()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(torch.autograd.grad(loss, lp)[0], torch.autograd.grad(want, lp)[0])


@pytest.mark.parametrize("clip", [{"max_is_weight": 1.5}, {"max_is_weight": 10.0}, {"is_clip_eps": 0.2}])
def test_flowrl_weight_multiplies_each_trajectorys_weight(clip):
    """loss = mean_b c[b] w[b] delta[b]^2 with w clipped by its own rule, value and gradients."""
    old, roll, mask = batch()
    lp = (old + 0.3 * torch.randn_like(old)).requires_grad_()
    log_z = torch.randn(7, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(7).double()  # float32 values: flowrl_loss hands the op float32 rewards
    c = torch.rand(7, dtype=torch.float64) * 2
    c[3] = 1.0  # the response without tokens: its rollout weight is 1 by definition
    loss, st = flowrl_loss(log_z, lp, roll, old, adv, mask, rollout_weight=c, **clip)
    eps = clip.get("is_clip_eps")
    lo, hi = (1 - eps, 1 + eps) if eps is not None else (0.0, clip["max_is_weight"])
    _, delta, w = tb_reference(log_z, lp, roll, old, adv, mask, min_is_weight=lo, max_is_weight=hi)
    want = (c * w * delta**2).mean()
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=0)
    for ours, theirs in zip(torch.autograd.grad(loss, [log_z, lp]), torch.autograd.grad(want, [log_z, lp])):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    assert math.isclose(st["tb/is_weight_mean"], float((c * w).mean()), rel_tol=1e-9)
    plain, _ = flowrl_loss(log_z, lp, roll, old, adv, mask, **clip)  # no weight: the op as before
    torch.testing.assert_close(plain, (w * delta**2).mean(), rtol=1e-10, atol=0)


def test_metrics_pooled_over_parts_equal_the_whole_batchs():
    """The workers' and mini-batches' sums pooled give the metrics of all their tokens at once."""
    old, roll, mask = batch(B=9)
    parts = [slice(0, 2), slice(2, 7), slice(7, 9)]

    def sums(sl):
        _, w = rollout_weights(old[sl], roll[sl], mask[sl], "token_tis", 2.0)
        return {**gap_sums(old[sl], roll[sl], mask[sl]), **{"w_" + k: v for k, v in w.items()}}

    pooled = rollout_metrics(pool_sums(sums(sl) for sl in parts))
    whole = rollout_metrics(sums(slice(None)))
    assert pooled.keys() == whole.keys() and len(whole) == 5
    for k in whole:
        assert math.isclose(pooled[k], whole[k], rel_tol=1e-6), k  # the weights are float32
