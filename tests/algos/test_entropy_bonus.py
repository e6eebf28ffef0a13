"""grpo.entropy_coef (docs/math.md §Entropy bonus): each policy loss minus c_H times the policy's
entropy aggregated as the loss is, written out here in float64 plain PyTorch; the bonus's gradient
reaches the logits through token_logprob's entropy. verl's actor form judges it too, in its venv
(tests/integrations/test_verl.py)."""

import pytest
import torch

from reasonrl_fast.algos import get_algo
from reasonrl_fast.algos.grpo import grpo_loss
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.ops import token_logprob

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
LOSSES = [("clip", a) for a in AGGS] + [("gspo", "seq-mean-token-mean")] + [("cispo", a) for a in AGGS]


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    B, T, V = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((2, 7), (3, 19), (5, 41)))
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.75).double()
    mask[0] = 0  # a response with no tokens adds 0
    mask[-1, 0] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logits, targets, mask, adv


def _agg_reference(x, mask, agg):
    """The three aggregations, written out: over all tokens; per response, then over responses."""
    if agg == "token-mean":
        return (x * mask).sum() / mask.sum()
    per = (x * mask).sum(1)
    if agg == "seq-mean-token-mean":
        per = per / mask.sum(1).clamp(min=1)
    return per.mean()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy,agg", LOSSES)
def test_the_bonus_subtracts_the_aggregated_entropy_and_its_gradient_reaches_the_logits(seed, policy, agg):
    logits, targets, mask, adv = _inputs(seed)
    tau, coef = 0.7, 0.03
    lp, ent = token_logprob(logits, targets, temperature=tau, return_entropy=True)
    old = (lp + 0.05 * torch.randn_like(lp)).detach()
    clip = (3e-4, 4e-4) if policy == "gspo" else (0.2, 0.28)
    ours, _ = grpo_loss(lp, old, adv, mask, *clip, agg, policy_loss=policy, entropy=ent, entropy_coef=coef)
    (g_ours,) = torch.autograd.grad(ours, logits)

    # the same in plain PyTorch: log_softmax, the entropy -sum p log p, the loss without the bonus
    x = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(x / tau, -1)
    lp_ref = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent_ref = -(logp.exp() * logp).sum(-1)
    pg, _ = grpo_loss(lp_ref, old, adv, mask, *clip, agg, policy_loss=policy)
    ref = pg - coef * _agg_reference(ent_ref, mask, agg)
    (g_ref,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("agg", AGGS)
def test_the_bonus_alone_raises_the_entropy(agg):
    """With no advantage the loss is the bonus alone: a step down its gradient raises the
    entropy of every response token, and leaves the masked ones alone."""
    logits, targets, mask, _ = _inputs(11)
    lp, ent = token_logprob(logits, targets, return_entropy=True)
    loss, _ = grpo_loss(lp, lp.detach(), torch.zeros(len(mask), dtype=torch.float64), mask, agg=agg,
                        entropy=ent, entropy_coef=1.0)
    (g,) = torch.autograd.grad(loss, logits)
    assert torch.all(g[mask == 0] == 0)
    with torch.no_grad():
        _, after = token_logprob(logits - 1e-3 * g / g.abs().max(), targets, return_entropy=True)
    assert torch.all((after > ent.detach())[mask.bool()])


def test_the_setting_for_grpo_and_fapo_and_its_refusals():
    logits, targets, mask, adv = _inputs(3)
    lp, ent = token_logprob(logits, targets, return_entropy=True)
    old = lp.detach()
    for algo in ("grpo", "fapo"):
        cfg = load_config(None, [f"algo={algo}", "grpo.entropy_coef=0.01"])
        loss, _ = get_algo(algo).loss(cfg, lp, old, None, adv, mask, None, None, ent)
        want, _ = grpo_loss(lp, old, adv, mask, entropy=ent, entropy_coef=0.01)
        assert torch.equal(loss, want)
    off, _ = get_algo("grpo").loss(load_config(None, ["algo=grpo"]), lp, old, None, adv, mask, None, None, ent)
    assert torch.equal(off, grpo_loss(lp, old, adv, mask)[0])  # 0, the default: the loss as before
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo=grpo", "grpo.entropy_coef=-0.01"])
    assert "grpo.entropy_coef" in str(e.value) and "-0.01" in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the policy's per-token entropy"):
        grpo_loss(lp, old, adv, mask, entropy_coef=0.01)
