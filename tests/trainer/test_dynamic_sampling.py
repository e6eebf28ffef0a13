"""DAPO's dynamic sampling (data.filter_groups, trainer/dynamic.py): the group filter, its
settings, and the rounds of `fill_batch` through the cluster's fan-out and the workers'
`sample_timed` down to an engine that answers by the prompt, with Ray's remote calls run in
place. The trainer runs are in test_dynamic_sampling_e2e.py."""

import sys
from types import SimpleNamespace

import pytest
import torch
from tests.helpers.in_place import in_place_cluster

from reasonrl_fast.algos import advantages, get_algo, groups_with_spread
from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError, UserError
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.rewards.score import default_compute_score
from reasonrl_fast.rollout import sample_seeds
from reasonrl_fast.rollout.base import Engine, Samples
from reasonrl_fast.runtime.datasets import Sampler
from reasonrl_fast.trainer import dynamic

# ---------------------------------------------------------------- the filter


def test_a_group_is_kept_only_when_its_values_differ():
    acc = [True, True, False, False, True, False, False, True, True]
    assert groups_with_spread(acc, 3) == [True, True, True]
    assert groups_with_spread(acc, 1) == [False] * 9  # a group of one has no spread
    assert groups_with_spread([1.0, 1.0, 0.0, -0.0, 0.5, 0.5 + 1e-12], 2) == [False, False, True]
    assert groups_with_spread([], 4) == []
    with pytest.raises(ValueError, match="7 values do not make groups of 2"):
        groups_with_spread([True] * 7, 2)


# ---------------------------------------------------------------- the settings


def test_the_settings_are_off_by_default_and_round_limit_is_daposs():
    d = load_config(None, []).data
    assert d.filter_groups is None and d.gen_prompts_per_step is None and d.max_gen_rounds == 10
    assert d.gen_prompts() == d.prompts_per_step
    d = load_config(None, ["data.filter_groups=acc", "data.gen_prompts_per_step=48"]).data
    assert d.gen_prompts() == 48


@pytest.mark.parametrize("tp", [1, 2])
def test_an_engine_is_sized_for_a_generation_round_not_the_training_batch(tp):
    """The engine samples a round of gen_prompts_per_step prompts at once: the batch the KV cache
    (vLLM on CPU) and the planner count is its share of those, not of prompts_per_step."""
    from reasonrl_fast.util import rollout_sequences

    base = ["data.prompts_per_step=8", "rollout.n=4", "trainer.workers_per_node=4",
            f"rollout.tensor_parallel_size={tp}", "rollout.backend=vllm"]
    assert rollout_sequences(load_config(None, base)) == 8 // 4 * tp * 4
    cfg = load_config(None, [*base, "data.filter_groups=acc", "data.gen_prompts_per_step=24"])
    assert rollout_sequences(cfg) == 24 // 4 * tp * 4


def test_in_split_placement_an_engine_is_sized_for_its_rollout_workers_share():
    """The rollout workers' ranks share a round as their calls do (rollout/group.py `shares`): 10
    prompts over 2 engines of TP 2 are 3 + 3 and 2 + 2 rank shares, so the larger engine samples 6
    prompts, not the 5 of an even split nor a trainer worker's share."""
    from reasonrl_fast.rollout.group import WorkerGroup
    from reasonrl_fast.util import rollout_sequences

    cfg = load_config(None, ["data.prompts_per_step=10", "rollout.n=4", "trainer.workers_per_node=4",
                             "trainer.placement=split", "rollout.workers=2", "rollout.tensor_parallel_size=2",
                             "rollout.backend=vllm"])
    group = object.__new__(WorkerGroup)
    group.count, group.tp = 4, 2
    assert max(len(g) for g, _ in group.shares(10)) * 4 == rollout_sequences(cfg) == 6 * 4


@pytest.mark.parametrize("args, match", [
    (["data.filter_groups=reward"], "data.filter_groups='reward': the shaped reward is not a filter metric: "
                                    "overlong shaping"),
    (["data.filter_groups=seq_final_reward"], "the shaped reward is not a filter metric"),
    (["data.filter_groups=accuracy"], r"data.filter_groups='accuracy': must be one of \('acc', 'score'\)"),
    (["data.gen_prompts_per_step=32"], "data.gen_prompts_per_step=32: needs data.filter_groups"),
    (["data.filter_groups=acc", "data.gen_prompts_per_step=8"], "gen_prompts_per_step=8: below "
                                                                "data.prompts_per_step=16"),
    (["data.filter_groups=acc", "data.max_gen_rounds=-1"], "data.max_gen_rounds=-1"),
    (["data.filter_groups=acc", "rollout.n=1"], r"rollout.n=1: a group of one sample never has a spread"),
])
def test_settings_that_cannot_filter_are_refused_with_one_line(args, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, args)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- the rounds


def answer_kind(i: int) -> str:
    """How the engine answers prompt i (its first operand): all right, all wrong (each wrong
    answer a different length), or mixed."""
    return ("right", "wrong", "mixed", "wrong", "right")[i % 5]


class AnsweringEngine(Engine):
    """Answers `a+b=` by `answer_kind(a)`; records each call's prompts and seeds."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seeds):
        self.calls.append({"prompts": [self.tok.decode(p, skip_special_tokens=True) for p in prompts], "seeds": seeds})
        out = []
        for text in self.calls[-1]["prompts"]:
            a, b = (int(x) for x in text.rstrip("=").split("+"))
            kind = answer_kind(a)
            for j in range(n):
                right = kind == "right" or (kind == "mixed" and j % 2 == 0)
                out.append(rf"so \boxed{{{a + b}}}" if right else rf"so \boxed{{{-1 - j * 1000}}}")
        ids = [self.tok(t, add_special_tokens=False)["input_ids"] for t in out]
        # the log-probs say which sample they are: the batch must carry each one's own
        return Samples(ids, [[float(seeds[i])] * len(x) for i, x in enumerate(ids)])


class Pool:
    last_latencies = [0.01]

    def score(self, samples):
        return ([default_compute_score(*s) for s in samples], {"reward/timeouts": 0, "reward/errors": 1})


class RecordingJudge:
    def __init__(self):
        self.sent = {}

    def submit(self, index, item, response):
        assert index not in self.sent
        self.sent[index] = (item["prompt"], response)


def _run(overrides, monkeypatch, world=2, records=40, judge=None):
    cfg = load_config(None, ["rollout.n=4", "data.prompts_per_step=4", "optim.mini_batch_prompts=4",
                             "data.filter_groups=acc", "trainer.seed=7", *overrides])
    tok = char_tokenizer()
    c, engines = in_place_cluster(cfg, lambda: AnsweringEngine(tok), monkeypatch, world)
    train_set = [{"prompt": f"{i}+{i + 1}=", "answer": str(2 * i + 1), "data_source": "math"}
                 for i in range(records)]
    run = SimpleNamespace(cfg=cfg, cluster=c, pool=Pool(), tok=tok, train_set=train_set,
                          sampler=Sampler(records, 0, False), judge=judge)
    return run, engines


def _first_operand(record) -> int:
    return int(record["prompt"].split("+")[0])


def test_rounds_go_on_until_the_step_s_groups_are_kept_and_it_trains_on_exactly_those(monkeypatch):
    """Prompts 0.. in order, 4 a round: one mixed group in each 5 prompts, so round k keeps
    the mixed among prompts 4k..4k+3; 4 groups kept after rounds 0-4 (prompts 2, 7, 12, 17)."""
    run, engines = _run(["data.gen_prompts_per_step=4"], monkeypatch)
    items, roll, batch, m = dynamic.fill_batch(run, step=3)
    assert [_first_operand(it) for it in items] == [2, 7, 12, 17]
    assert m["rollout/gen_rounds"] == 5 and m["rollout/groups_generated"] == 20 and m["rollout/groups_kept"] == 4
    assert m["rollout/generated_per_trained"] == 5.0
    assert m["accuracy/generated_mean"] == (2 * 4 + 2) * 4 / 80  # each 5 prompts: 2 all right, 1 mixed
    assert run.sampler.state() == _sampler_after(40, 20)  # 5 rounds x 4 prompts drawn
    # the batch: each kept group's own responses, log-probs and prompt ids, in order
    assert roll["acc"] == [True, False] * 8 and len(roll["responses"]) == len(batch.responses) == 16
    assert batch.prompts == roll["prompts"] and batch.n == 4 and batch.responses == roll["responses"]
    assert [run.tok.decode(p) for p in batch.prompts] == [it["prompt"] for it in items]
    # round k's seeds: the step's stream for round 0 (as without the filter), its own after
    seeds = [s for k in range(5) for e in engines for s in e.calls[k]["seeds"]]  # round by round
    assert seeds[:16] == sample_seeds(7, 3, 0, 16)
    assert seeds[16:32] == sample_seeds(7, "3/round1", 0, 16)
    assert len(set(seeds)) == 80
    kept_seeds = [lp[0] for lp in batch.logprobs]
    assert kept_seeds == [float(s) for k, g in ((0, 2), (1, 3), (3, 0), (4, 1))
                          for s in sample_seeds(7, 3 if k == 0 else f"3/round{k}", g * 4, 4)]
    assert roll["metrics"]["reward/errors"] == 5 * 2  # every round's, each worker's share
    assert roll["time/rollout_s"] >= 0 and roll["time/reward_s"] > 0


def _sampler_after(size, drawn):
    s = Sampler(size, 0, False)
    s.next(drawn)
    return s.state()


def test_a_larger_generation_batch_fills_the_step_in_fewer_rounds_and_the_surplus_is_dropped(monkeypatch):
    run, _ = _run(["data.gen_prompts_per_step=12"], monkeypatch)
    items, roll, _, m = dynamic.fill_batch(run, step=1)
    # round 0: prompts 0-11 (mixed: 2, 7); round 1: 12-23 (12, 17, 22): the first 4 kept train
    assert [_first_operand(it) for it in items] == [2, 7, 12, 17]
    assert m["rollout/gen_rounds"] == 2 and m["rollout/groups_kept"] == 5 and m["rollout/groups_generated"] == 24
    assert m["rollout/generated_per_trained"] == 24 * 4 / 16


def test_the_round_limit_stops_the_run_with_one_line_naming_what_it_kept(monkeypatch):
    run, engines = _run(["data.gen_prompts_per_step=4", "data.max_gen_rounds=3"], monkeypatch)
    with pytest.raises(dynamic.GroupFilterError) as e:
        dynamic.fill_batch(run, step=2)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith("step 2: 2 of data.prompts_per_step=4 groups kept after data.max_gen_rounds=3 rounds "
                          "of 4 prompts (data.filter_groups=acc")
    assert sum(len(e.calls) for e in engines) == 3 * 2  # exactly 3 rounds, on both workers


def test_no_limit_runs_the_rounds_it_takes(monkeypatch):
    """One mixed group in 12 prompts: 12 rounds of 4, past the default limit of 10."""
    monkeypatch.setattr(sys.modules[__name__], "answer_kind", lambda i: "mixed" if i % 12 == 11 else "right")
    run, _ = _run(["data.gen_prompts_per_step=4", "data.max_gen_rounds=0"], monkeypatch, records=60)
    items, _, _, m = dynamic.fill_batch(run, step=1)
    assert [_first_operand(it) for it in items] == [11, 23, 35, 47] and m["rollout/gen_rounds"] == 12


def test_the_shaped_reward_trap_an_all_wrong_group_of_different_lengths_is_dropped(monkeypatch):
    """DAPO's overlong shaping gives the all-wrong group's answers (each a different length)
    different rewards, hence advantages that are not 0; the filter reads acc and drops it."""
    run, _ = _run(["data.gen_prompts_per_step=4", "grpo.overlong_buffer=8", "rollout.max_new_tokens=16",
                   "algo=grpo"], monkeypatch)
    cfg = run.cfg
    items, roll, _, _ = dynamic.fill_batch(run, step=1)
    assert 1 not in [_first_operand(it) for it in items]
    # prompt 1's group (all wrong), as the algorithm would shape it: mixed rewards
    r1 = [rf"so \boxed{{{-1 - j * 1000}}}" for j in range(4)]
    lengths = torch.tensor([len(run.tok(t, add_special_tokens=False)["input_ids"]) for t in r1])
    shaped = get_algo("grpo").rewards(cfg, [-1.0] * 4, [False] * 4, None, lengths)
    assert len(set(shaped.tolist())) > 1
    assert advantages(shaped, torch.zeros(4, dtype=torch.long)).abs().max() > 0.5


def test_score_keeps_groups_whose_raw_scores_differ(monkeypatch):
    run, _ = _run(["data.filter_groups=score", "data.gen_prompts_per_step=4",
                   "data.reward_fn=tests.helpers.faulty_rewards:right_by_checksum"], monkeypatch)
    run.pool.score = lambda samples: ([{"score": float(len(s[1])), "acc": True} for s in samples],
                                      {"reward/timeouts": 0, "reward/errors": 0})
    items, roll, _, m = dynamic.fill_batch(run, step=1)
    # every answer is "right", but the wrong answers' lengths differ: the mixed and all-wrong
    # groups have a spread of scores; the all-right ones, equal lengths, do not
    assert [answer_kind(_first_operand(it)) for it in items] == ["wrong", "mixed", "wrong", "wrong"]
    assert m["rollout/gen_rounds"] == 2


def test_the_judge_is_sent_the_kept_groups_right_answers_numbered_across_rounds(monkeypatch):
    judge = RecordingJudge()
    run, _ = _run(["data.gen_prompts_per_step=4"], monkeypatch, judge=judge)
    items, roll, _, _ = dynamic.fill_batch(run, step=1)
    # the kept groups' right answers only (an all-right group is dropped: never judged)
    assert sorted(judge.sent) == [i for i, a in zip(roll["judge_index"], roll["acc"]) if a]
    assert [judge.sent[i][0] for i in sorted(judge.sent)] == [it["prompt"] for it in items for _ in range(2)]
    # round k's sample i is k * 16 + i: prompt 2 of round 0 starts at 8, prompt 7 (round 1) at 16 + 12
    assert roll["judge_index"][:8] == [8, 9, 10, 11, 28, 29, 30, 31]
