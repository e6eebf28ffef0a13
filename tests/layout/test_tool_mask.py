"""Multi-turn samples' masks in the update (trainer/policy.py `response_mask`): a tool
observation's tokens get no gradient (exactly zero on their logits), the losses normalise by the
policy's tokens over micro-batches as in one pass, and the rollout diagnostics (the log-prob gap,
the importance weights' counts) count the policy's tokens only; for GRPO, FlowRL and FAPO."""

import random

import pytest
import torch

from reasonrl_fast.algos import get_algo
from reasonrl_fast.config import load_config
from reasonrl_fast.trainer import update
from reasonrl_fast.trainer.policy import Actor
from tests.layout.test_micro import CASES, _model, samples


def tool_masks(seed, responses):
    """Each response a two-turn transcript: policy tokens, an observation (mask 0) in the middle of
    most, policy tokens again; some without a call."""
    rng = random.Random(seed)
    out = []
    for r in responses:
        if len(r) < 4 or rng.random() < 0.25:
            out.append([1] * len(r))
            continue
        a = rng.randint(1, len(r) - 3)
        b = rng.randint(a + 1, len(r) - 1)
        out.append([1] * a + [0] * (b - a) + [1] * (len(r) - b))
    return out


def _setup(algo_name, override, seed, correction="token_tis"):
    cfg = load_config(None, [f"algo={algo_name}", override, f"rollout.correction={correction}", "rollout.n=3"])
    algo = get_algo(cfg.algo)
    return cfg, algo, Actor(_model(seed), 2 if algo.zhead else 0).double().eval()


@pytest.mark.parametrize("algo_name,override", CASES)
def test_an_observations_tokens_get_exactly_no_gradient(algo_name, override):
    seed = torch.initial_seed() % 2**31
    prompts, responses, rollout = samples(seed, 3, 3, 6, 14)
    masks = tool_masks(seed, responses)
    assert any(0 in m for m in masks)
    cfg, algo, actor = _setup(algo_name, override, seed)
    logits = {}

    def keep(_module, _args, out):
        if out.requires_grad:  # the update's forward, not the reference's
            out.retain_grad()
            logits["x"] = out

    actor.head.register_forward_hook(keep)
    adv = torch.randn(len(responses), dtype=torch.float64)
    idx = list(range(len(responses)))
    batch, lp = update.micro_batch(prompts, responses, rollout, idx, False, 0, "cpu", masks=masks)
    ref = update.logprobs(actor, [[(batch, lp)]], cfg.rollout.temperature)[0] if algo.needs_ref(cfg) else None
    total = update.units(responses, idx, algo.loss_units(cfg), masks)
    update.accumulate(actor, algo, cfg, responses, [idx], [(batch, lp)], adv, total, 1, None, ref, 1, masks)
    g = logits["x"].grad  # [B, R, V]: the head runs on the positions that predict response tokens
    assert g.shape[:2] == batch["targets"].shape
    for b, m in enumerate(masks):
        for t, k in enumerate(m):
            row = g[b, t]
            if k:
                assert row.abs().max() > 0, (b, t)
            else:
                assert torch.equal(row, torch.zeros_like(row)), (b, t)


@pytest.mark.parametrize("algo_name,override", CASES)
@pytest.mark.parametrize("packed", [True, False])
def test_micro_batches_normalise_by_the_policys_tokens(algo_name, override, packed):
    """The mini-batch's gradient through several micro-batches equals one pass's, with masks; and
    changing the tokens and log-probs under the masks changes nothing."""
    seed = torch.initial_seed() % 2**31
    prompts, responses, rollout = samples(seed, 5, 3, 1, 30)
    masks = tool_masks(seed, responses)
    adv = torch.randn(len(responses), dtype=torch.float64)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    budget = max(max(lengths), sum(lengths) // 5)

    def grads(responses, rollout, budget, correction="none"):
        cfg, algo, actor = _setup(algo_name, override, seed, correction)
        chunk = [slice(0, len(responses))]
        plans, totals = update.plan(prompts, responses, chunk, budget, packed, algo.loss_units(cfg), 1, "cpu",
                                    masks=masks)
        batches = [update.micro_batch(prompts, responses, rollout, idx, packed, 0, "cpu", masks=masks)
                   for idx in plans[0]]
        ref = update.logprobs(actor, [batches], cfg.rollout.temperature)[0] if algo.needs_ref(cfg) else None
        stats, sums = update.accumulate(actor, algo, cfg, responses, plans[0], batches, adv, totals[0], 1, None, ref,
                                        1, masks)
        return stats, sums, {n: q.grad.clone() for n, q in actor.named_parameters() if q.grad is not None}

    s1, sums1, g1 = grads(responses, rollout, 0)
    s2, sums2, g2 = grads(responses, rollout, budget)
    for name in g1:
        assert (g1[name] - g2[name]).abs().max() / g1[name].abs().max().clamp(min=1.0) < 1e-10, name
    assert s2["train/loss"] == pytest.approx(s1["train/loss"], rel=1e-10, abs=1e-12)
    # sampler log-probs far off under the masks: not read (the same gap, importance weights and
    # gradient; the weights are float32, so each against the same layout's)
    wild = [[lp if k else -40.0 for lp, k in zip(r, m)] for r, m in zip(rollout, masks)]
    s1, sums1, g1 = grads(responses, rollout, 0, "token_tis")
    s3, sums3, g3 = grads(responses, wild, 0, "token_tis")
    policy = sum(map(sum, masks))
    assert sum(s["tokens"] for s in sums1) == sum(s["tokens"] for s in sums3) == policy
    for key in sums1[0]:
        assert sum(s[key] for s in sums3) == sum(s[key] for s in sums1), key
    assert max(s["max"] for s in sums3) < 10
    if algo_name != "flowrl":  # FlowRL's IS weight is one per sequence: its count is the sequences'
        assert sum(s["w_count"] for s in sums3) == policy
    assert all(torch.equal(g1[n], g3[n]) for n in g1) and s3 == s1
    # the observation's tokens still condition what follows them: other tokens, another gradient
    rng = random.Random(seed)
    other = [[t if k else rng.randint(3, 28) for t, k in zip(r, m)] for r, m in zip(responses, masks)]
    _, _, g4 = grads(other, rollout, 0, "token_tis")
    assert any(not torch.equal(g1[n], g4[n]) for n in g1)
