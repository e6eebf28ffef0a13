"""Micro-batches by token budget: the split's guarantees, and a mini-batch's loss and gradient
through micro-batches (padded or packed rows) equal to the same mini-batch in one pass, in
float64, for every loss aggregation."""

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.algos import get_algo
from reasonrl_fast.config import load_config
from reasonrl_fast.trainer import update
from reasonrl_fast.layout.micro import cost, split
from reasonrl_fast.trainer.policy import Actor


@pytest.mark.parametrize("packed", [True, False])
def test_split_covers_every_sequence_within_the_budget(packed):
    rng = random.Random(torch.initial_seed())
    for _ in range(200):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(max(lengths), 400)
        groups = split(lengths, budget, packed)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert all(g for g in groups)
        assert all(cost([lengths[i] for i in g], packed) <= budget for g in groups)
        # no fewer than the budget allows: the cheapest packing of all tokens
        assert len(groups) >= -(-sum(lengths) // budget) if packed else len(groups) >= 1
        more = len(groups) + rng.randint(0, 5)
        exact = split(lengths, budget, packed, count=more)
        assert len(exact) == more
        assert sorted(i for g in exact for i in g) == list(range(len(lengths)))
        assert all(cost([lengths[i] for i in g], packed) <= budget for g in exact)
        assert sum(not g for g in exact) <= max(0, more - len(lengths))  # empty only when short of sequences


def test_split_balances_and_groups_by_length():
    lengths = [50, 10, 48, 12, 49, 11, 47, 13]
    packed = split(lengths, 100, True)  # 240 tokens: 3 micro-batches of about 80
    loads = sorted(cost([lengths[i] for i in g], True) for g in packed)
    # longest-first's guarantee: at most (4/3 - 1/(3k)) of the best split's largest micro-batch
    assert len(packed) == 3 and loads[-1] <= (4 / 3 - 1 / 9) * 80, loads
    padded = split(lengths, 100, False)  # the long ones together, the short ones together
    assert sorted(sorted(lengths[i] for i in g) for g in padded)[-1][0] >= 47
    assert split(lengths, 0, True) == [list(range(8))]  # no budget: one forward
    assert split([70, 5], 60, True) == [[0], [1]]  # a sequence longer than the budget: its own
    with pytest.raises(ValueError, match="cannot hold"):
        split(lengths, 100, True, count=1)


def _model(seed):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=29, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    return Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa").double()


def samples(seed, prompts, n, lo, hi):
    rng = random.Random(seed)
    ps = [[rng.randint(3, 28) for _ in range(rng.randint(2, 6))] for _ in range(prompts)]
    prompts = [p for p in ps for _ in range(n)]
    responses = [[rng.randint(3, 28) for _ in range(rng.randint(lo, hi))] for _ in prompts]
    rollout = [[-rng.random() * 3 for _ in r] for r in responses]
    return prompts, responses, rollout


CASES = [("grpo", "grpo.loss_agg=token-mean"), ("grpo", "grpo.loss_agg=seq-mean-token-mean"),
         ("grpo", "grpo.loss_agg=seq-mean-token-sum"), ("flowrl", "flowrl.beta=2.0"), ("fapo", "grpo.kl_coef=0.1")]


def grads(algo_name, override, prompts, responses, rollout, adv, budget, packed, seed, correction="none",
          old_forward=False):
    """The gradient of one mini-batch through update.plan/micro_batch/accumulate in one process;
    `old_forward`: its old log-probs from a forward of their own first, not the update's own."""
    cfg = load_config(None, [f"algo={algo_name}", override, f"rollout.correction={correction}", "rollout.n=3"])
    algo = get_algo(cfg.algo)
    actor = Actor(_model(seed), 2 if algo.zhead else 0).double().eval()  # eval: no Z-head dropout
    chunk = [slice(0, len(responses))]
    plans, totals = update.plan(prompts, responses, chunk, budget, packed, algo.loss_units(cfg), 1, "cpu")
    batches = [update.micro_batch(prompts, responses, rollout, idx, packed, 0, "cpu") for idx in plans[0]]
    ref = update.logprobs(actor, [batches], cfg.rollout.temperature)[0] if algo.needs_ref(cfg) else None
    old = update.logprobs(actor, [batches], cfg.rollout.temperature)[0] if old_forward else None
    stats, _ = update.accumulate(actor, algo, cfg, responses, plans[0], batches, adv, totals[0], 1, old, ref)
    return len(plans[0]), stats, {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("algo_name,override", CASES)
@pytest.mark.parametrize("packed", [True, False])
def test_micro_batches_give_the_mini_batch_gradient(algo_name, override, packed):
    seed = torch.initial_seed() % 2**31
    prompts, responses, rollout = samples(seed, 5, 3, 1, 30)  # lengths from 1 to 30: a 10x spread and more
    adv = torch.randn(len(responses), dtype=torch.float64)
    n1, s1, g1 = grads(algo_name, override, prompts, responses, rollout, adv, 0, False, seed)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    # a fifth of the tokens, or the longest sequence (which holds at most 36 of at least 36 + 14 x 3):
    # at least 3 micro-batches on every draw, 5 on most
    budget = max(max(lengths), sum(lengths) // 5)
    n2, s2, g2 = grads(algo_name, override, prompts, responses, rollout, adv, budget, packed, seed)
    assert n1 == 1 and n2 >= -(-sum(lengths) // budget) >= 3
    assert g1.keys() == g2.keys() and g1
    for name in g1:
        scale = g1[name].abs().max().clamp(min=1.0)
        assert (g1[name] - g2[name]).abs().max() / scale < 1e-10, name
    assert s2["train/loss"] == pytest.approx(s1["train/loss"], rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("algo_name,override", CASES)
@pytest.mark.parametrize("correction", ["token_tis", "seq_tis"])
def test_one_mini_batch_needs_no_forward_for_the_old_log_probs_however_old_the_samples(algo_name, override,
                                                                                      correction):
    """The decoupled objective's π_prox is the trainer's weights at the start of the update: with one
    mini-batch those are the weights of the update's own forward, so its detached log-probs are the
    old ones, whatever weights sampled the responses (their log-probs, drawn here far from the
    model's, enter only the correction's weight). The split trainer runs no forward for them."""
    seed = torch.initial_seed() % 2**31
    prompts, responses, rollout = samples(seed, 4, 3, 1, 20)
    adv = torch.randn(len(responses), dtype=torch.float64)
    budget = max(len(p) + len(r) for p, r in zip(prompts, responses))  # several micro-batches, one update
    n1, s1, g1 = grads(algo_name, override, prompts, responses, rollout, adv, budget, True, seed, correction)
    n2, s2, g2 = grads(algo_name, override, prompts, responses, rollout, adv, budget, True, seed, correction, True)
    assert n1 == n2 > 1 and g1.keys() == g2.keys() and g1
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name
    assert s1 == s2
