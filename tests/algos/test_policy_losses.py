"""grpo.policy_loss = gspo | cispo (docs/math.md §GSPO and CISPO) against their papers' formulas
written out here in float64 plain PyTorch at the level each defines them: GSPO's per sequence
(the loss of exp(mean log-ratio), whose gradient the token form must spread over the tokens),
CISPO's per token with the clipped weight a constant. verl's own functions judge them too, in its
venv (tests/integrations/test_verl.py)."""

import pytest
import torch

from reasonrl_fast.algos import get_algo
from reasonrl_fast.algos.grpo import grpo_loss
from reasonrl_fast.config import ConfigError, load_config


def _inputs(seed: int, spread: float):
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(3, 30, (1,), generator=g))
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread).requires_grad_(True)
    mask = (torch.rand(B, T, generator=g) < 0.75).double()
    mask[0] = 0  # a response with no tokens adds 0
    mask[-1, 0] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    w = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    return lp, old, adv, mask, w


def gspo_reference(lp, old, adv, mask, lo, hi, w=None):
    """(loss, its gradient in lp). Per sequence: s = exp(mean_t (lp - old)), loss
    max(-A s, -A clip(s)), then the mean over the B responses (an empty one adds 0); a token
    weight w multiplies each token's copy of its sequence's loss. Gradient: d s / d lp_t is
    s / n, so token t of an unclipped sequence gets -A s w_t / (n B), of a clipped one 0."""
    B, n = lp.shape[0], mask.sum(1).clamp(min=1)
    w = torch.ones_like(mask) if w is None else w
    s = torch.exp(((lp - old) * mask).sum(1) / n)
    per_seq = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - lo, 1 + hi))
    loss = (per_seq[:, None] * w * mask).sum(1) / n
    kept = (-adv * s >= -adv * torch.clamp(s, 1 - lo, 1 + hi)).double()  # the unclipped branch is the max
    grad = (kept * -adv * s)[:, None] * w * mask / n[:, None] / B
    return loss.mean(), grad


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("weighted", [False, True])
def test_gspo_is_the_clipped_sequence_ratio_and_its_gradient(seed, weighted):
    lp, old, adv, mask, w = _inputs(seed, 3e-4)
    w = w if weighted else None
    lo, hi = 3e-4, 4e-4
    ours, stats = grpo_loss(lp, old, adv, mask, lo, hi, "seq-mean-token-mean", rollout_weight=w, policy_loss="gspo")
    (g_ours,) = torch.autograd.grad(ours, lp)
    ref, g_ref = gspo_reference(lp.detach(), old, adv, mask, lo, hi, w)
    torch.testing.assert_close(ours.detach(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-14)
    assert 0 <= stats["grpo/clip_frac"] <= 1


def test_gspo_clips_whole_sequences():
    """A sequence whose ratio left the clip range in the direction of its advantage has no
    gradient on any token; one inside it has a gradient on every token."""
    old = torch.zeros(2, 4, dtype=torch.float64)
    lp = torch.tensor([[0.1] * 4, [1e-5] * 4], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 4, dtype=torch.float64)
    loss, stats = grpo_loss(lp, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask, 3e-4, 4e-4,
                            "seq-mean-token-mean", policy_loss="gspo")
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.all(g[0] == 0) and torch.all(g[1] != 0)
    assert stats["grpo/clip_frac"] == 0.5


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_cispo_keeps_every_tokens_gradient_weighted_by_its_clipped_ratio(seed, agg):
    lp, old, adv, mask, w = _inputs(seed, 0.4)
    lo, hi = 0.2, 0.28
    ours, stats = grpo_loss(lp, old, adv, mask, lo, hi, agg, rollout_weight=w, policy_loss="cispo")
    (g_ours,) = torch.autograd.grad(ours, lp)
    ratio = torch.exp(lp.detach() - old)
    per_tok = -torch.clamp(ratio, 1 - lo, 1 + hi) * adv[:, None] * w * mask  # d(loss_tok)/d(lp), the weight a constant
    if agg == "token-mean":
        scale = 1 / mask.sum()
        want_loss = (per_tok * lp.detach()).sum() * scale
        want_grad = per_tok * scale
    else:
        per_seq = mask.sum(1, keepdim=True).clamp(min=1) if agg == "seq-mean-token-mean" else torch.ones_like(mask[:, :1])
        want_grad = per_tok / per_seq / mask.shape[0]
        want_loss = (per_tok * lp.detach() / per_seq).sum() / mask.shape[0]
    torch.testing.assert_close(ours.detach(), want_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, want_grad, rtol=1e-12, atol=1e-14)
    assert bool((g_ours[mask.bool()] != 0).all())  # no token's gradient dropped
    changed = (ratio != torch.clamp(ratio, 1 - lo, 1 + hi)).double()
    assert stats["grpo/clip_frac"] == pytest.approx(float((changed * mask).sum() / mask.sum()), abs=1e-6)


def test_gspo_gradcheck():
    """Without token weights GSPO's token form is the gradient of its own value (the sequence
    objective). With them it is not, by design (each token's weight scales its share, verl's
    form), and CISPO's stop-gradient weight makes its gradient differ from its value's by
    design too: those are checked against their closed forms above instead."""
    lp, old, adv, mask, _ = _inputs(123, 0.05)
    assert torch.autograd.gradcheck(
        lambda x: grpo_loss(x, old, adv, mask, 0.2, 0.28, "seq-mean-token-mean", policy_loss="gspo")[0],
        (lp.detach().clone().requires_grad_(True),))


def test_the_settings_and_their_refusals():
    cfg = load_config(None, ["algo=grpo", "grpo.policy_loss=gspo", "grpo.loss_agg=seq-mean-token-mean",
                             "grpo.clip_low=3e-4", "grpo.clip_high=4e-4"])
    lp, old, adv, mask, _ = _inputs(5, 1e-4)
    loss, _ = get_algo("grpo").loss(cfg, lp, old, None, adv, mask, None)
    want, _ = grpo_loss(lp, old, adv, mask, 3e-4, 4e-4, "seq-mean-token-mean", policy_loss="gspo")
    assert torch.equal(loss, want)
    assert load_config(None, ["algo=fapo", "grpo.policy_loss=cispo"]).grpo.policy_loss == "cispo"
    for bad, says in ((["grpo.policy_loss=gspo"], "grpo.loss_agg='token-mean': with policy_loss=gspo must be "
                                                  "seq-mean-token-mean"),
                      (["grpo.policy_loss=cispo", "grpo.clip_ratio_c=10"], "is the dual clip of policy_loss=clip"),
                      (["grpo.policy_loss=ppo"], "grpo.policy_loss='ppo': must be one of ('clip', 'gspo', 'cispo')")):
        with pytest.raises(ConfigError, match=None) as e:
            load_config(None, ["algo=grpo", *bad])
        assert says in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'"):
        grpo_loss(lp, old, adv, mask, policy_loss="ppo")
