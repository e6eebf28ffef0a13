"""Advantage and loss plumbing against docs/math.md, on hand-computed cases."""

import math

import pytest
import torch

from reasonrl_fast.algos import advantages, overlong_penalty
from reasonrl_fast.algos.fapo import fapo_rewards
from reasonrl_fast.algos.flowrl import flowrl_loss
from reasonrl_fast.algos.grpo import aggregate, grpo_loss, kl_k3


def test_group_advantage_hand_case():
    # group 0: rewards 1, 0, 1 -> mean 2/3, unbiased std sqrt(1/3); group 1 (one response): 0
    r = torch.tensor([1.0, 0.0, 5.0, 1.0])
    g = torch.tensor([0, 0, 1, 0])
    a = advantages(r, g)
    s = math.sqrt(1 / 3)
    exp = torch.tensor([(1 - 2 / 3) / (s + 1e-6), (0 - 2 / 3) / (s + 1e-6), 5.0, (1 - 2 / 3) / (s + 1e-6)])
    torch.testing.assert_close(a, exp)
    torch.testing.assert_close(advantages(r, g, norm_by_std=False),
                               torch.tensor([1 / 3, -2 / 3, 5.0, 1 / 3]))


def test_grpo_clip_higher_token_mean():
    # ratios e^0.5 (clipped at 1.28 for A>0), e^-0.5 (clipped at 0.8 for A<0 -> min picks clip)
    lp = torch.tensor([[0.5, -0.5], [0.5, 0.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, st = grpo_loss(lp, old, adv, mask)
    e = math.exp
    # seq0 (A=1): min(e^.5, 1.28) = 1.28 ; min(e^-.5, 0.8) = e^-.5 (unclipped 0.6065 < 0.8)
    # seq1 (A=-1): min(-e^.5, -1.28) = -e^.5 ; masked token ignored
    tok = [-1.28, -e(-0.5), e(0.5)]
    assert loss.item() == pytest.approx(sum(tok) / 3, rel=1e-5)
    loss.backward()
    # the clipped token gets no gradient; the unclipped ones d(-ratio*A)/dlp = -ratio*A / 3
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -e(-0.5) / 3], [e(0.5) / 3, 0.0]]))
    assert st["grpo/clip_frac"] == pytest.approx(1 / 3)  # only the first token is clipped


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3) / 3),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 3) / 2),
    ("seq-mean-token-sum", ((1 + 2) + 3) / 2),
])
def test_aggregation_modes(mode, expected):
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, m, mode).item() == pytest.approx(expected)


def test_kl_k3_and_coef():
    lp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    k3 = kl_k3(lp, ref)
    torch.testing.assert_close(k3, torch.tensor([[math.exp(-1) + 1 - 1, 0.0]]))
    m = torch.ones(1, 2)
    base, _ = grpo_loss(lp, lp, torch.tensor([0.0]), m)
    with_kl, st = grpo_loss(lp, lp, torch.tensor([0.0]), m, ref_logprob=ref, kl_coef=0.5)
    assert with_kl.item() - base.item() == pytest.approx(0.5 * math.exp(-1) / 2, rel=1e-5)
    assert st["kl/mean"] == pytest.approx(math.exp(-1) / 2, rel=1e-5)


def test_overlong_penalty():
    lengths = torch.tensor([10, 16, 18, 20])
    p = overlong_penalty(lengths, max_len=20, buffer=4, factor=1.0)
    torch.testing.assert_close(p, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    assert overlong_penalty(lengths, 20, 0, 1.0).abs().sum() == 0


def test_flowrl_loss_matches_spec():
    torch.manual_seed(0)
    b, t = 3, 4
    log_z = torch.randn(b, requires_grad=True)
    lp = torch.randn(b, t, requires_grad=True)
    ref, old = torch.randn(b, t), torch.randn(b, t)
    adv = torch.randn(b)
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    loss, st = flowrl_loss(log_z, lp, ref, old, adv, m, beta=15.0, max_is_weight=10.0)
    n = m.sum(-1)
    delta = log_z + (lp * m).sum(-1) / (n + 1e-8) - 15 * adv - (ref * m).sum(-1) / (n + 1e-8)
    w = torch.clamp(torch.exp(((lp - old) * m).sum(-1)), max=10.0).detach()
    exp = (w * delta**2).mean()
    assert loss.item() == pytest.approx(exp.item(), rel=1e-5)
    assert st["tb/is_weight_mean"] == pytest.approx(w.mean().item(), rel=1e-5)
    assert st["tb/delta_abs_mean"] == pytest.approx(delta.abs().mean().item(), rel=1e-5)
    loss.backward()
    torch.testing.assert_close(log_z.grad, (2 * w * delta / b).detach(), rtol=1e-5, atol=1e-6)


def test_fapo_rewards():
    acc = [True, True, False, False]
    flagged = [False, True, False, True]  # a wrong answer is never sent; a flag on one changes nothing
    assert fapo_rewards(acc, flagged, 1.0).tolist() == [1.0, 0.0, -1.0, -1.0]
    assert fapo_rewards(acc, flagged, 0.5).tolist() == [1.0, 0.5, -1.0, -1.0]
    assert fapo_rewards(acc, flagged, 0.0).tolist() == [1.0, 1.0, -1.0, -1.0]  # GRPO's +1/-1
    with pytest.raises(ValueError):
        fapo_rewards([True], [], 1.0)


def test_the_one_split_rule_allows_uneven_shares():
    from reasonrl_fast.util import shares

    assert shares(16, 2) == [range(0, 8), range(8, 16)]
    assert shares(5, 2) == [range(0, 3), range(3, 5)]
    assert shares(5, 4) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert shares(1, 3) == [range(0, 1), range(1, 1), range(1, 1)]
    for count in range(12):
        for parts in range(1, 6):
            got = shares(count, parts)
            assert [i for r in got for i in r] == list(range(count))
            assert max(map(len, got)) - min(map(len, got)) <= 1


def test_mini_batches_of_a_share_and_the_largest_forward():
    from reasonrl_fast.config import load_config
    from reasonrl_fast.layout import mini_batches, tokens_per_forward

    cfg = load_config(None, ["data.prompts_per_step=5", "optim.mini_batch_prompts=3", "rollout.n=4",
                             "rollout.max_new_tokens=10"])
    # ceil(5 / 3) = 2 mini-batches; worker 0 holds 3 prompts (12 samples), worker 1 holds 2
    assert mini_batches(cfg, 3) == [slice(0, 8), slice(8, 12)]
    assert mini_batches(cfg, 2) == [slice(0, 4), slice(4, 8)]
    assert tokens_per_forward(cfg, 2) == 2 * 4 * 10
    even = load_config(None, ["data.prompts_per_step=16", "optim.mini_batch_prompts=8", "rollout.n=8"])
    assert mini_batches(even, 8) == [slice(0, 32), slice(32, 64)]  # as before: equal halves
    assert tokens_per_forward(even, 2) == 4 * 8 * even.rollout.max_new_tokens


def test_a_worker_without_a_prompt_in_a_mini_batch_is_refused():
    from reasonrl_fast.config import ConfigError, load_config

    load_config(None, ["data.prompts_per_step=3"])  # 2 workers: shares of 2 and 1, one mini-batch
    with pytest.raises(ConfigError, match="each needs at least one prompt per mini-batch"):
        load_config(None, ["data.prompts_per_step=4", "optim.mini_batch_prompts=1"])


def test_registries_list_the_known_names():
    from reasonrl_fast.algos import ALGOS, get_algo
    from reasonrl_fast.tasks import TASKS, get_task, task_of

    assert set(ALGOS) == {"grpo", "flowrl", "fapo"} and set(TASKS) == {"addition", "code", "genrm", "multiply", "partition"}
    with pytest.raises(ValueError, match="unknown algorithm 'dapo': known algorithms are flowrl, grpo, fapo"):
        get_algo("dapo")
    with pytest.raises(ValueError, match="unknown task 'sudoku': known tasks are addition, code, genrm, multiply, partition"):
        get_task("sudoku")
    assert task_of({"data_source": "addition"}) is get_task("addition") and get_task("addition").name == "addition"
    assert task_of({"data_source": "math"}) is None
    # what each algorithm asks of the trainer
    facts = [(get_algo(n).uses_genrm, get_algo(n).zhead) for n in ALGOS]
    assert facts == [(False, True), (False, False), (True, False)]


def test_each_algorithm_reads_its_own_section():
    """The reference model and the overlong shaping of each algorithm, as before for every
    setting: GRPO and FAPO from the grpo section, FlowRL from its own (its TB loss always reads
    the reference)."""
    from reasonrl_fast.algos import get_algo
    from reasonrl_fast.config import load_config

    lengths = torch.tensor([10, 16, 18, 20])
    scores, acc = [1.0, 0.0, 1.0, 0.0], [True, False, True, False]
    shaped = torch.tensor(scores) + torch.tensor([0.0, 0.0, -0.5, -1.0])
    for name, own, other in (("grpo", "grpo", "flowrl"), ("fapo", "grpo", "flowrl"), ("flowrl", "flowrl", "grpo")):
        algo = get_algo(name)
        for kl in (0.0, 0.1):
            cfg = load_config(None, [f"algo={name}", f"grpo.kl_coef={kl}"])
            assert algo.needs_ref(cfg) == (name == "flowrl" or kl > 0)
        cfg = load_config(None, [f"algo={name}", "rollout.max_new_tokens=20", f"{own}.overlong_buffer=4",
                                 f"{other}.overlong_buffer=0"])
        flagged = [False] * 4
        base = algo.outcome_rewards(cfg, scores, acc, flagged)
        torch.testing.assert_close(algo.rewards(cfg, scores, acc, flagged, lengths) - base,
                                   shaped - torch.tensor(scores))
        off = load_config(None, [f"algo={name}", "rollout.max_new_tokens=20"])
        if name != "flowrl":  # FlowRL refuses GRPO's buffer instead of ignoring it (below)
            off = load_config(None, [f"algo={name}", "rollout.max_new_tokens=20", f"{other}.overlong_buffer=4"])
        torch.testing.assert_close(algo.rewards(off, scores, acc, flagged, lengths), base)
    fapo = load_config(None, ["algo=fapo", "rollout.max_new_tokens=20"])
    torch.testing.assert_close(get_algo("fapo").rewards(fapo, scores, acc, [True, False, False, False], lengths),
                               fapo_rewards(acc, [True, False, False, False], 1.0))


def test_a_flowrl_config_with_grpos_overlong_buffer_is_refused():
    from reasonrl_fast.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"grpo.overlong_buffer=4096 is GRPO's overlong shaping, which algo=flowrl "
                                          r"does not read: set flowrl.overlong_buffer"):
        load_config(None, ["algo=flowrl", "grpo.overlong_buffer=4096"])
    load_config(None, ["algo=grpo", "grpo.overlong_buffer=4096"])


def test_the_verl_flowrl_recipe_keeps_its_overlong_shaping_and_the_papers_has_none():
    """configs/flowrl_qwen2.5_7b_math_verl.yaml shapes FlowRL's rewards with DAPO's 4096-token
    buffer, as verl's recipe does, from its own section; the paper's script (and so
    configs/flowrl_qwen2.5_7b_math.yaml) shapes nothing."""
    import os

    from reasonrl_fast.algos import get_algo
    from reasonrl_fast.config import load_config

    configs = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
    lengths = torch.tensor([100, 4096, 6000, 8192])
    scores = [1.0, 1.0, 0.0, 1.0]
    cfg = load_config(os.path.join(configs, "flowrl_qwen2.5_7b_math_verl.yaml"))
    got = get_algo(cfg.algo).rewards(cfg, scores, [s > 0 for s in scores], None, lengths)
    torch.testing.assert_close(got, torch.tensor(scores) + overlong_penalty(lengths, 8192, 4096, 1.0))
    assert got[3] == 0.0 and got[0] == 1.0
    cfg = load_config(os.path.join(configs, "flowrl_qwen2.5_7b_math.yaml"))
    got = get_algo(cfg.algo).rewards(cfg, scores, [s > 0 for s in scores], None, lengths)
    torch.testing.assert_close(got, torch.tensor(scores))


@pytest.mark.parametrize("count,world,tp", [(7, 4, 2), (64, 8, 4), (5, 4, 4), (3, 4, 2), (16, 2, 1), (9, 8, 8)])
def test_an_engines_prompts_are_its_workers_shares(count, world, tp):
    """With tensor-parallel engines each worker still owns its `shares` share (what it trains
    on, as at TP 1), and samples its engine's: the union of the shares of its TP consecutive
    workers, the same for all of them."""
    from reasonrl_fast.util import engine_shares, shares

    split = engine_shares(count, world, tp)
    assert [own for _, own in split] == shares(count, world)
    for rank, (group, own) in enumerate(split):
        members = range(rank - rank % tp, rank - rank % tp + tp)
        assert list(group) == [i for m in members for i in shares(count, world)[m]]
        assert own.start >= group.start and own.stop <= group.stop
        assert all(split[m][0] == group for m in members)
