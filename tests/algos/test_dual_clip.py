"""GRPO's dual clip (grpo.clip_ratio_c) and log-ratio bound, against verl's vanilla policy loss
written out here in float64 plain PyTorch (docs/math.md §GRPO and DAPO policy loss)."""

import math

import pytest
import torch

from reasonrl_fast.algos import get_algo
from reasonrl_fast.algos.grpo import grpo_loss
from reasonrl_fast.config import load_config

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def reference(lp, old, adv, mask, eps_low, eps_high, c, agg, weight=None):
    """verl's compute_policy_loss_vanilla: losses (not surrogates), max of the two branches, then
    min with -A c where A < 0; the rollout weight after the dual clip. Also the tokens where the
    dual clip binds (verl's pg_clipfrac_lower)."""
    ratio = torch.exp(torch.clamp(lp - old, min=-20.0, max=20.0))
    a = adv[:, None].expand_as(lp)
    loss1 = -a * ratio
    loss2 = -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clipped = torch.maximum(loss1, loss2)
    if c is None:
        per_tok, binds = clipped, torch.zeros_like(mask, dtype=torch.bool)
    else:
        loss3 = -a * c
        per_tok = torch.where(a < 0, torch.minimum(clipped, loss3), clipped)
        binds = (a < 0) & (clipped > loss3)
    if weight is not None:
        per_tok = per_tok * (weight if weight.dim() == 2 else weight[:, None])
    per_tok = per_tok * mask
    if agg == "token-mean":
        loss = per_tok.sum() / max(float(mask.sum()), 1.0)
    elif agg == "seq-mean-token-mean":
        loss = (per_tok.sum(1) / mask.sum(1).clamp(min=1.0)).mean()
    else:
        loss = per_tok.sum(1).mean()
    return loss, binds


def random_batch(b, t, c, gen):
    """Log-ratios spread well past c and 1/c, both advantage signs, ragged masks (one row empty)."""
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 5
    delta = (torch.rand(b, t, generator=gen, dtype=torch.float64) - 0.5) * 2 * (math.log(c) + 1.5)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    adv[0], adv[1] = -abs(adv[0]) - 0.1, abs(adv[1]) + 0.1   # each sign present
    delta[0, : t // 2] = math.log(c) + 0.5                     # A < 0 and ratio > c: the dual clip binds
    delta[0, t // 2:] = torch.rand(t - t // 2, generator=gen, dtype=torch.float64) * (math.log(c) - 0.2)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    mask[-1] = 0.0
    mask[0] = 1.0                                              # and A < 0 tokens in (1, c): they push
    return old + delta, old, adv, mask


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("weighted", [None, "token", "sequence"])
def test_dual_clip_against_the_reference(agg, weighted):
    gen = torch.Generator().manual_seed(int(torch.initial_seed()) % 2**31)
    b, t, c, eps_low, eps_high = 7, 13, 3.0, 0.2, 0.28
    lp0, old, adv, mask = random_batch(b, t, c, gen)
    weight = {None: None, "token": torch.rand(b, t, generator=gen, dtype=torch.float64) + 0.5,
              "sequence": torch.rand(b, generator=gen, dtype=torch.float64) + 0.5}[weighted]

    lp = lp0.clone().requires_grad_(True)
    loss, stats = grpo_loss(lp, old, adv, mask, eps_low, eps_high, agg, rollout_weight=weight, clip_ratio_c=c)
    loss.backward()
    lp_ref = lp0.clone().requires_grad_(True)
    want, binds = reference(lp_ref, old, adv, mask, eps_low, eps_high, c, agg, weight)
    want.backward()

    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-12, atol=1e-12)
    counted = binds & (mask > 0)
    assert counted.sum() >= t // 2  # the case the feature is for is really present
    assert stats["grpo/dual_clip_frac"] == pytest.approx(float(counted.sum() / mask.sum()), abs=1e-7)
    # where the dual clip binds the token's loss is a constant: no gradient
    assert torch.all(lp.grad[binds] == 0)
    # and it binds nowhere else: A < 0 tokens with a ratio below c still push
    free = (adv[:, None] < 0) & ~binds & (mask > 0) & (torch.exp(lp0 - old) > 1 - eps_low)
    assert free.any() and torch.all(lp.grad[free] != 0)


@pytest.mark.parametrize("agg", AGGS)
def test_off_is_todays_loss_exactly(agg):
    """None leaves the loss and its gradient as they were before the dual clip existed (the
    log-ratios here stay inside the bound, where the clamp changes nothing)."""
    gen = torch.Generator().manual_seed(int(torch.initial_seed()) % 2**31)
    lp0, old, adv, mask = random_batch(5, 11, 3.0, gen)
    lp0, old, adv, mask = lp0.float(), old.float(), adv.float(), mask.float()
    weight = torch.rand(5, 11, generator=gen)

    lp = lp0.clone().requires_grad_(True)
    loss, stats = grpo_loss(lp, old, adv, mask, 0.2, 0.28, agg, rollout_weight=weight, clip_ratio_c=None)
    loss.backward()
    # the surrogate as it was written before: min of the two branches, weighted, negated
    lp_old = lp0.clone().requires_grad_(True)
    ratio = torch.exp(lp_old - old)
    a = adv.unsqueeze(-1)
    surr = torch.minimum(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a) * weight
    m = mask
    if agg == "token-mean":
        before = (-surr * m).sum() / m.sum().clamp(min=1.0)
    elif agg == "seq-mean-token-mean":
        before = ((-surr * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    else:
        before = (-surr * m).sum(-1).mean()
    before.backward()
    assert torch.equal(loss, before) and torch.equal(lp.grad, lp_old.grad)
    assert "grpo/dual_clip_frac" not in stats


def test_the_log_ratio_is_bounded_before_exp():
    """A token the policy has moved e^50-fold since the rollout: exp would overflow float32 to
    inf, and inf times a zero gradient is NaN. Bounded at 20 (verl), loss and gradient are finite
    and the token's loss is the bounded ratio's."""
    lp = torch.tensor([[50.0, 0.1], [-50.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # the masked token's ratio is 1
    loss, _ = grpo_loss(lp, old, adv, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    # A > 0: clipped at 1.28 (no gradient); e^0.1 unclipped; A < 0 with ratio e^-20: clipped at 0.8
    want = (-1.28 - math.exp(0.1) + 0.8) / 3
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert lp.grad[0, 0] == 0 and lp.grad[1, 0] == 0
    assert lp.grad[0, 1].item() == pytest.approx(-math.exp(0.1) / 3, rel=1e-6)
    # A < 0 with a ratio past the bound and no dual clip: the loss is -A e^20, not inf
    lp2 = torch.tensor([[50.0]], requires_grad=True)
    loss2, _ = grpo_loss(lp2, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    loss2.backward()
    assert loss2.item() == pytest.approx(math.exp(20.0), rel=1e-6) and lp2.grad.item() == 0


@pytest.mark.parametrize("algo", ["grpo", "fapo"])
def test_the_setting_reaches_the_loss(algo):
    """grpo.clip_ratio_c is threaded from the config for GRPO and for FAPO (which trains with
    GRPO's loss)."""
    gen = torch.Generator().manual_seed(int(torch.initial_seed()) % 2**31)
    lp, old, adv, mask = random_batch(4, 9, 2.5, gen)
    cfg_on = load_config(None, [f"algo={algo}", "grpo.clip_ratio_c=2.5"])
    cfg_off = load_config(None, [f"algo={algo}"])
    assert cfg_off.grpo.clip_ratio_c is None
    a = get_algo(algo)
    on, st_on = a.loss(cfg_on, lp, old, None, adv, mask, None)
    off, st_off = a.loss(cfg_off, lp, old, None, adv, mask, None)
    assert torch.equal(on, grpo_loss(lp, old, adv, mask, clip_ratio_c=2.5)[0])
    assert torch.equal(off, grpo_loss(lp, old, adv, mask)[0])
    assert on < off and st_on["grpo/dual_clip_frac"] > 0 and "grpo/dual_clip_frac" not in st_off
